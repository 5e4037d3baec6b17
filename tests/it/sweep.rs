//! `acpo sweep` (issue #23): the spec and its refusals, the plan, a run with resume, the report.

use std::path::{Path, PathBuf};

use acpo::sweep::{plan, Spec, SweepError};

/// The smoke GRPO-AC and GRPO manifests with their model in `ws`, and a spec over them.
fn workspace(grid: &str, seeds: usize) -> (tempfile::TempDir, PathBuf) {
    let ws = crate::train::workspace();
    for name in ["smoke-grpo-ac", "smoke-grpo"] {
        let (_, text) = crate::train::manifest(ws.path(), name, &[]);
        std::fs::write(ws.path().join(format!("{name}.yaml")), text).expect("manifest");
    }
    let spec = ws.path().join("spec.yaml");
    write_spec(&spec, ws.path(), grid, seeds);
    (ws, spec)
}

fn write_spec(spec: &Path, ws: &Path, grid: &str, seeds: usize) {
    std::fs::write(
        spec,
        format!(
            "name: t\nbase: {}\nbaseline: {}\nseeds: {seeds}\ngrid:\n{grid}",
            ws.join("smoke-grpo-ac.yaml").display(),
            ws.join("smoke-grpo.yaml").display()
        ),
    )
    .expect("spec");
}

fn refusal(spec_text_grid: &str, seeds: usize) -> String {
    let (ws, spec) = workspace(spec_text_grid, seeds);
    let err = Spec::load(&spec).and_then(|s| plan(&s, &spec).map(|_| ()));
    drop(ws);
    err.expect_err("refused").to_string()
}

#[test]
fn bad_specs_are_refused_naming_the_field() {
    let cases = [
        ("  algorithm.alpha: [1, 2]\n", 0, "`seeds`"),
        ("  {}\n", 1, "`grid`"),
        ("  algorithm.alpha: []\n", 1, "`grid.algorithm.alpha`"),
        ("  seed: [1, 2]\n", 1, "`grid.seed`"),
        // not in the manifest format: the manifest's own refusal names it
        ("  algorithm.alfa: [1]\n", 1, "algorithm.alfa"),
        // a GRPO manifest has no critic to put a learning rate in
        ("  critic.optim.lr: [1.0e-3]\n", 1, "`grid.critic.optim.lr`"),
        // a value the manifest refuses is the grid field's fault
        ("  algorithm.alpha: [-1]\n", 1, "`grid.algorithm.alpha`"),
    ];
    for (grid, seeds, field) in cases {
        let msg = refusal(grid, seeds);
        assert!(msg.contains(field), "{grid}: {msg}");
    }
    // Issue #35: a text value is one YAML scalar, so it cannot add a field (here `alpha: 9`
    // under `algorithm`); the manifest refuses it as the value of its own field.
    let msg = refusal(
        "  algorithm.policy_loss: [\"cispo\\nalgorithm:\\n  alpha: 9\"]\n",
        1,
    );
    assert!(msg.contains("`grid.algorithm.policy_loss`"), "{msg}");
    // Planning is bounded: a million grid points are refused before any is made.
    let thousand = (0..1000)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let started = std::time::Instant::now();
    let msg = refusal(
        &format!("  algorithm.alpha: [{thousand}]\n  actor.epochs: [{thousand}]\n"),
        1,
    );
    assert!(msg.contains("`grid`") && msg.contains("4096 runs"), "{msg}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    // A seed at the top of its range cannot be followed by more seeds: refused, not wrapped.
    let (ws, spec) = workspace("  algorithm.alpha: [1]\n", 2);
    let base = ws.path().join("smoke-grpo-ac.yaml");
    let text = std::fs::read_to_string(&base).expect("base");
    let top = text
        .lines()
        .map(|l| {
            if l.starts_with("seed:") {
                format!("seed: {}", u64::MAX)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&base, top + "\n").expect("w");
    let err = Spec::load(&spec)
        .and_then(|s| plan(&s, &spec).map(|_| ()))
        .expect_err("wraps")
        .to_string();
    assert!(
        err.contains("`seed`") && err.contains("largest seed"),
        "{err}"
    );
    drop(ws);
    // A grid point's manifest error names a file that is there (the base), not the point's.
    let (ws, spec) = workspace("  algorithm.alpha: [1]\n", 1);
    let base = ws.path().join("smoke-grpo-ac.yaml");
    let text = std::fs::read_to_string(&base).expect("base");
    std::fs::write(&base, text.replace("  n: 4", "  n: 0")).expect("w");
    let err = Spec::load(&spec)
        .and_then(|s| plan(&s, &spec).map(|_| ()))
        .expect_err("bad base")
        .to_string();
    assert!(
        err.contains(&base.display().to_string()) && !err.contains("t-p0"),
        "{err}"
    );
    drop(ws);
    // An unknown spec field is a parse error that names it.
    let (ws, spec) = workspace("  algorithm.alpha: [1]\n", 1);
    let text = std::fs::read_to_string(&spec).expect("spec") + "repeats: 3\n";
    std::fs::write(&spec, text).expect("spec");
    let err = Spec::load(&spec).expect_err("unknown field");
    assert!(matches!(err, SweepError::Parse { .. }) && err.to_string().contains("repeats"));
    drop(ws);
    // Through the binary: exit 2, one line naming the field.
    let (ws, spec) = workspace("  algorithm.alpha: []\n", 1);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["sweep", spec.to_str().expect("utf8"), "--results"])
        .arg(ws.path().join("r"))
        .output()
        .expect("acpo runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`grid.algorithm.alpha`"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn the_plan_is_the_grid_times_the_seeds_and_baselines_take_only_their_fields() {
    let (_ws, spec_path) = workspace(
        "  algorithm.alpha: [0.5, 1.0e9]\n  actor.mini_batch_size: [2, 4]\n",
        3,
    );
    let spec = Spec::load(&spec_path).expect("spec");
    let variants = plan(&spec, &spec_path).expect("plan");
    let points: Vec<_> = variants.iter().filter(|v| v.point.is_some()).collect();
    assert_eq!(points.len(), 4 * 3);
    // the baseline has no α: it varies only with the mini-batch size (2 manifests × 3 seeds)
    let baselines: Vec<_> = variants.iter().filter(|v| v.point.is_none()).collect();
    assert_eq!(baselines.len(), 2 * 3);
    for v in &variants {
        // grid points are named after the sweep, baseline runs keep their manifest's name
        let expected = if v.point.is_some() {
            "t-p"
        } else {
            "smoke-grpo"
        };
        assert!(v.exp.name.starts_with(expected), "{}", v.exp.name);
        assert!((1..=3).contains(&v.exp.seed));
        if let Some(k) = v.point {
            let values = &spec.points()[k];
            let alpha = match v.exp.algorithm.clip {
                acpo::algo::clip::PolicyClip::Advantage { alpha } => alpha,
                other => panic!("{other:?}"),
            };
            assert_eq!(values[1].1.yaml(), if alpha == 0.5 { "0.5" } else { "1e9" });
            assert_eq!(values[0].1.yaml(), v.exp.actor.mini_batch_size.to_string());
            // its pair: the baseline with the same mini-batch size and seed
            let pair = baselines
                .iter()
                .find(|b| b.baseline == v.baseline && b.exp.seed == v.exp.seed)
                .expect("paired");
            assert_eq!(pair.exp.actor.mini_batch_size, v.exp.actor.mini_batch_size);
        }
    }
    // every run is distinct
    let mut fps: Vec<String> = variants.iter().map(|v| v.exp.fingerprint()).collect();
    fps.sort();
    fps.dedup();
    assert_eq!(fps.len(), variants.len());
}

#[test]
fn a_sweep_trains_resumes_and_reports_the_paired_differences() {
    let (ws, spec) = workspace("  algorithm.alpha: [0.5, 2.0]\n", 2);
    let results = ws.path().join("r");
    let data = acpo::data::DataLocation::Dir(ws.path().join("no-data"));
    let train = || {
        let sweeps = acpo::sweep::load_all(std::slice::from_ref(&spec)).expect("spec");
        let source = acpo::sweep::Source::Train {
            data: &data,
            jobs: Some(2),
        };
        acpo::sweep::run(&sweeps, source, &results, None).expect("sweep")
    };
    let (reports, written) = train();
    let root = reports.join("t");
    let table = std::fs::read_to_string(root.join("sweep.md")).expect("sweep.md");
    assert!(written.iter().any(|w| w.ends_with("sweep.svg")));
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| 0.5 |") || l.starts_with("| 2.0 |"))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    for r in &rows {
        assert!(r.contains("| 2 |"), "two seeds: {r}");
    }
    // 2 points × 2 seeds in the sweep's directory, 1 baseline × 2 seeds in the shared one
    let run_dirs = || -> Vec<PathBuf> {
        let mut d: Vec<PathBuf> = ["t", acpo::sweep::BASELINES]
            .iter()
            .flat_map(|home| std::fs::read_dir(reports.join(home).join("smoke")).expect("runs"))
            .map(|e| e.expect("e").path())
            .filter(|p| p.is_dir())
            .collect();
        d.sort();
        d
    };
    assert_eq!(run_dirs().len(), 6, "{:?}", run_dirs());
    assert_eq!(
        run_dirs()
            .iter()
            .filter(|d| d.starts_with(reports.join(acpo::sweep::BASELINES)))
            .count(),
        2
    );
    // A second call reuses every finished run: nothing is rewritten.
    let stamp = |p: PathBuf| std::fs::metadata(p).expect("m").modified().expect("t");
    let stamps = || -> Vec<_> {
        run_dirs()
            .into_iter()
            .map(|d| stamp(d.join("provenance.json")))
            .collect()
    };
    let before = stamps();
    train();
    assert_eq!(before, stamps(), "finished runs are reused");
    assert_eq!(
        std::fs::read_to_string(root.join("sweep.md")).expect("again"),
        table
    );
    // The pairing, against a hand computation: give grid point 0's seed-1 run a best of 25 %
    // (the smoke model solves nothing, so every other run has 0).
    let sweep = acpo::sweep::Sweep::load(&spec).expect("spec");
    let target = sweep
        .variants
        .iter()
        .find(|v| v.point == Some(0) && v.exp.seed == 1)
        .expect("p0 seed 1");
    let eval = acpo::run::RunDir::of(&target.exp, &root).eval();
    let text = std::fs::read_to_string(&eval).expect("eval.jsonl");
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    lines[1]["weighted_accuracy"] = serde_json::json!(0.25);
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&eval, text.join("\n") + "\n").expect("write");
    let dirs = acpo::sweep::trained_dirs(std::slice::from_ref(&sweep), &reports);
    let finished = acpo::sweep::finished(&dirs).expect("results");
    let points = acpo::sweep::point_results(&sweep, &finished);
    let (p0, p1) = (&points[0], &points[1]);
    let mean = |i: &Option<acpo::report::seeds::Interval>| i.as_ref().expect("interval").mean;
    assert!((mean(&p0.best) - 12.5).abs() < 1e-9);
    assert!(
        (mean(&p0.delta_best) - 12.5).abs() < 1e-9,
        "paired: (25 + 0) / 2"
    );
    let half = p0
        .delta_best
        .as_ref()
        .and_then(|i| i.half_width)
        .expect("two seeds");
    // t(1) = 12.706, sd of {25, 0} = 17.68, n = 2
    assert!(
        (half - 12.706 * (312.5f64 / 2.0).sqrt()).abs() < 1e-2,
        "{half}"
    );
    assert_eq!(mean(&p1.delta_best), 0.0);
}

/// The inputs of issue #23's study (tools/generators/make_study.py): every spec in sweeps/ loads and plans
/// into valid manifests, with the grid the issue asks for.
#[test]
fn the_study_specs_plan_the_issues_grid() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cwd = std::env::current_dir().expect("cwd");
    assert_eq!(cwd, repo, "spec paths are relative to the repository root");
    let mut total = 0;
    for family in ["grpo", "ppo"] {
        let ac = repo.join(format!("sweeps/study-{family}-ac.yaml"));
        let spec = Spec::load(&ac).expect("spec");
        let runs = plan(&spec, &ac).expect("plan");
        // α ∈ {0.5, 1, 2, 3, 5, no clip} × {1, 4, 16} mini-batches per step × 3 seeds, and
        // the baseline at the three degrees × 3 seeds
        assert_eq!(runs.len(), 6 * 3 * 3 + 3 * 3, "{family}");
        let degrees: std::collections::BTreeSet<usize> = runs
            .iter()
            .map(|v| v.exp.trainer.batch_size / v.exp.actor.mini_batch_size)
            .collect();
        assert_eq!(degrees.into_iter().collect::<Vec<_>>(), [1, 4, 16]);
        total += runs.len();
        for loss in ["cispo", "gspo"] {
            let path = repo.join(format!("sweeps/study-{family}-{loss}.yaml"));
            let spec = Spec::load(&path).expect("spec");
            let runs = plan(&spec, &path).expect("plan");
            assert_eq!(runs.len(), 2 * 3 * 3, "{family} {loss}");
            total += runs.len();
        }
    }
    assert_eq!(total, 2 * (63 + 36));
    // The three sweeps of a family share its baseline's 9 runs: 162 distinct runs in all.
    let specs: Vec<PathBuf> = ["grpo", "ppo"]
        .iter()
        .flat_map(|f| {
            ["ac", "cispo", "gspo"].map(|r| repo.join(format!("sweeps/study-{f}-{r}.yaml")))
        })
        .collect();
    let sweeps = acpo::sweep::load_all(&specs).expect("specs");
    let distinct: std::collections::BTreeSet<String> = sweeps
        .iter()
        .flat_map(|s| &s.variants)
        .map(|v| acpo::run::RunDir::name_of(&v.exp))
        .collect();
    assert_eq!(distinct.len(), 162);
}

/// Two sweeps against one baseline (as the study's ACPO and CISPO sweeps of a family): the
/// baseline's runs train once, in the shared directory; `--compare` tables every rule by policy
/// updates per step; an archive of the runs rebuilds the same reports with `--from` (through
/// the binary, filling a document's blocks), and one that lacks runs is refused, exit 2.
#[test]
fn sweeps_share_their_baseline_compare_and_rebuild_from_an_archive() {
    let (ws, ac) = workspace(
        "  algorithm.alpha: [0.5, 2.0]\n  actor.mini_batch_size: [4, 1]\n",
        1,
    );
    let ws = ws.path();
    let grpo = std::fs::read_to_string(ws.join("smoke-grpo.yaml")).expect("grpo");
    let cispo_base = grpo
        .replace("name: smoke-grpo\n", "name: smoke-grpo-cispo\n")
        .replace("  clip_ratio_c: 3.0\n", "  policy_loss: cispo\n");
    assert_ne!(cispo_base, grpo);
    std::fs::write(ws.join("smoke-grpo-cispo.yaml"), cispo_base).expect("cispo");
    let cispo = ws.join("cispo.yaml");
    std::fs::write(
        &cispo,
        format!(
            "name: t-cispo\nbase: {}\nbaseline: {}\nseeds: 1\ngrid:\n  actor.mini_batch_size: [4, 1]\n",
            ws.join("smoke-grpo-cispo.yaml").display(),
            ws.join("smoke-grpo.yaml").display()
        ),
    )
    .expect("spec");
    let specs = [ac, cispo];
    let sweeps = acpo::sweep::load_all(&specs).expect("specs");
    let data = acpo::data::DataLocation::Dir(ws.join("no-data"));
    let results = ws.join("r");
    let f1 = ws.join("f1");
    let compare = acpo::sweep::Compare {
        name: "cmp",
        figures: &f1,
    };
    let source = acpo::sweep::Source::Train {
        data: &data,
        jobs: Some(2),
    };
    let (reports, _) = acpo::sweep::run(&sweeps, source, &results, Some(compare)).expect("run");
    assert_eq!(reports, results.join("sweeps"));
    let count = |home: &str| {
        std::fs::read_dir(reports.join(home).join("smoke"))
            .expect("runs")
            .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
            .count()
    };
    // 4 + 2 grid points; the baseline at its two mini-batch sizes, trained once for both
    assert_eq!(
        (count("t"), count("t-cispo"), count(acpo::sweep::BASELINES)),
        (4, 2, 2)
    );
    let table = std::fs::read_to_string(reports.join("cmp.md")).expect("cmp.md");
    assert!(table.contains("#### Against GRPO (smoke-grpo)"), "{table}");
    assert!(
        table.contains("| | 1 update / step | 4 updates / step |"),
        "{table}"
    );
    for row in [
        "| GRPO (smoke-grpo): its own best |",
        "| GRPO-AC alpha=0.5 |",
        "| GRPO-AC alpha=2 |",
        "| GRPO cispo eps=0.2/0.28 |",
    ] {
        assert!(table.contains(row), "{row}: {table}");
    }
    assert!(ws.join("f1/cmp.svg").exists() && ws.join("f1/cmp.png").exists());
    // The off-policy axis reads in updates per step at their log2 positions (1, 4), never
    // an empty stretch of log2 values.
    let labels: Vec<String> =
        super::report::svg_texts(&std::fs::read_to_string(ws.join("f1/cmp.svg")).expect("svg"))
            .into_iter()
            .map(|(_, t)| t)
            .collect();
    assert!(
        labels.iter().any(|t| t == "1") && labels.iter().any(|t| t == "4"),
        "{labels:?}"
    );
    assert!(
        !labels.iter().any(|t| t == "2.0" || t == "9.0"),
        "{labels:?}"
    );

    // Pack every run (without checkpoints) and rebuild through the binary.
    let mut dirs: Vec<PathBuf> = acpo::sweep::trained_dirs(&sweeps, &reports)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).expect("dir"))
        .map(|e| e.expect("e").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 8);
    let archive = ws.join("all.tar.gz");
    let contents = acpo::archive::Contents { checkpoints: false };
    acpo::archive::archive(&dirs, &archive, contents).expect("archive");
    let doc = ws.join("DOC.md");
    let blank = "# x\n\n<!-- begin: cmp.md -->\n<!-- end: cmp.md -->\n\n<!-- begin: t/sweep.md -->\n<!-- end: t/sweep.md -->\n";
    std::fs::write(&doc, blank).expect("doc");
    let sweep_from = |archive: &Path, out: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
            .args(["sweep", "--compare", "cmp", "--from"])
            .arg(archive)
            .arg("--results")
            .arg(ws.join(out))
            .arg("--figures")
            .arg(ws.join("f2"))
            .arg("--doc")
            .arg(&doc)
            .args(&specs)
            .current_dir(ws)
            .output()
            .expect("acpo runs")
    };
    let out = sweep_from(&archive, "r2");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rebuilt = ws.join("r2/from-all/sweeps");
    for f in ["cmp.md", "t/sweep.md", "t-cispo/sweep.md"] {
        assert_eq!(
            std::fs::read_to_string(rebuilt.join(f)).expect("rebuilt"),
            std::fs::read_to_string(reports.join(f)).expect("trained"),
            "{f}"
        );
    }
    assert_eq!(
        std::fs::read(ws.join("f2/cmp.svg")).expect("svg"),
        std::fs::read(ws.join("f1/cmp.svg")).expect("svg")
    );
    let filled = std::fs::read_to_string(&doc).expect("doc");
    assert!(filled.contains(&format!(
        "<!-- begin: cmp.md -->\n{}\n<!-- end: cmp.md -->",
        table.trim_end()
    )));
    assert!(filled.contains("| 4 | 0.5 | 1 |"), "{filled}");

    // Without the CISPO sweep's runs the archive cannot give its report.
    let partial = ws.join("partial.tar.gz");
    let kept: Vec<PathBuf> = dirs
        .into_iter()
        .filter(|d| !d.starts_with(reports.join("t-cispo")))
        .collect();
    acpo::archive::archive(&kept, &partial, contents).expect("archive");
    let out = sweep_from(&partial, "r3");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("2 of the 8 runs the report expects are not there")
            && stderr.contains("t-cispo-p"),
        "{stderr}"
    );

    // Issue #35: runs are matched by the manifests they hold, not by their directories' names:
    // two directories swapped inside an archive rebuild the same reports.
    let unpacked = ws.join("unpacked");
    std::fs::create_dir_all(&unpacked).expect("mkdir");
    acpo::archive::unpack(&archive, &unpacked).expect("unpack");
    let t_runs: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&unpacked)
            .expect("ls")
            .map(|e| e.expect("e").path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("t-p"))
            })
            .collect();
        v.sort();
        v
    };
    let (a, b) = (&t_runs[0], &t_runs[1]);
    let tmp = unpacked.join("swap");
    std::fs::rename(a, &tmp).expect("mv");
    std::fs::rename(b, a).expect("mv");
    std::fs::rename(&tmp, b).expect("mv");
    let runs: Vec<PathBuf> = std::fs::read_dir(&unpacked)
        .expect("ls")
        .map(|e| e.expect("e").path())
        .filter(|p| p.is_dir())
        .collect();
    let swapped = ws.join("swapped.tar.gz");
    acpo::archive::archive(&runs, &swapped, contents).expect("archive");
    let out = sweep_from(&swapped, "r4");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("r4/from-swapped/sweeps/t/sweep.md")).expect("rebuilt"),
        std::fs::read_to_string(reports.join("t/sweep.md")).expect("trained"),
        "the swapped runs are reported under their own grid points"
    );
    // An accuracy that is not a fraction (resealed, so the checksums pass) is refused, naming
    // the file.
    let eval = a.join("eval.jsonl");
    let original = std::fs::read_to_string(&eval).expect("eval");
    let text = original.clone();
    let first: serde_json::Value =
        serde_json::from_str(text.lines().next().expect("a line")).expect("json");
    let accuracy = first["weighted_accuracy"].to_string();
    let text = text.replacen(
        &format!("\"weighted_accuracy\":{accuracy}"),
        "\"weighted_accuracy\":1e308",
        1,
    );
    assert!(text.contains("1e308"));
    std::fs::write(&eval, text).expect("w");
    acpo::archive::write_sums(a).expect("reseal");
    let corrupt = ws.join("corrupt.tar.gz");
    acpo::archive::archive(&runs, &corrupt, contents).expect("archive");
    let out = sweep_from(&corrupt, "r5");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("eval.jsonl") && stderr.contains("not a fraction in [0, 1]"),
        "{stderr}"
    );

    // Issue #47, item 9: a run whose metrics.jsonl was emptied (resealed) is not a finished run:
    // refused, naming the run and the file, as `reproduce --from` refuses it (one rule).
    std::fs::write(&eval, &original).expect("w");
    std::fs::write(a.join("metrics.jsonl"), "").expect("w");
    acpo::archive::write_sums(a).expect("reseal");
    let emptied = ws.join("emptied.tar.gz");
    acpo::archive::archive(&runs, &emptied, contents).expect("archive");
    let out = sweep_from(&emptied, "r6");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = a.file_name().expect("name").to_string_lossy();
    assert!(
        stderr.contains("not a complete run")
            && stderr.contains("metrics.jsonl")
            && stderr.contains(name.as_ref()),
        "{stderr}"
    );
    assert!(
        !ws.join("r6/from-emptied/sweeps").exists(),
        "no report written"
    );
}
