//! Checksummed archives: round trip, and every kind of tampering is reported with exit 1.

use std::path::{Path, PathBuf};
use std::process::Command;

fn acpo(args: &[&str], cwd: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("acpo runs")
}

/// A small fake run directory (clearly not a real result).
fn fake_run(root: &Path, name: &str) -> PathBuf {
    let run = root.join(name);
    std::fs::create_dir_all(run.join("checkpoints/step_000001")).expect("mkdir");
    std::fs::write(run.join("manifest.yaml"), "name: fake\n").expect("w");
    std::fs::write(run.join("metrics.jsonl"), "{\"training/global_step\":1}\n").expect("w");
    std::fs::write(run.join("checkpoints/step_000001/state.json"), "{}").expect("w");
    run
}

/// Re-packs a directory as .tar.gz (as a tamperer would).
fn repack(dir: &Path, out: &Path) {
    let file = std::fs::File::create(out).expect("create");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        file,
        flate2::Compression::fast(),
    ));
    tar.append_dir_all(".", dir).expect("append");
    tar.into_inner().expect("tar").finish().expect("gz");
}

#[test]
fn archives_verify_and_every_tampering_is_reported_with_exit_1() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (a, b) = (fake_run(tmp.path(), "run-a"), fake_run(tmp.path(), "run-b"));
    let archive = tmp.path().join("runs.tar.gz");
    let out = acpo(
        &[
            "archive",
            a.to_str().expect("u"),
            b.to_str().expect("u"),
            "--out",
            archive.to_str().expect("u"),
        ],
        tmp.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(PathBuf::from(format!("{}.sha256", archive.display())).exists());
    assert!(
        a.join("SHA256SUMS").exists(),
        "each run directory gets its own SHA256SUMS"
    );
    let ok = acpo(&["verify", archive.to_str().expect("u")], tmp.path());
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("OK: 8 files"),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    assert_eq!(
        acpo(&["verify", a.to_str().expect("u")], tmp.path())
            .status
            .code(),
        Some(0),
        "a run directory verifies too"
    );

    let unpacked = tmp.path().join("unpacked");
    std::fs::create_dir(&unpacked).expect("mkdir");
    acpo::archive::unpack(&archive, &unpacked).expect("unpack");
    let tampered = |name: &str, change: &dyn Fn(&Path)| -> String {
        let copy = tmp.path().join(name);
        let status = Command::new("cp")
            .args([
                "-r",
                unpacked.to_str().expect("u"),
                copy.to_str().expect("u"),
            ])
            .status()
            .expect("cp");
        assert!(status.success());
        change(&copy);
        let packed = tmp.path().join(format!("{name}.tar.gz"));
        repack(&copy, &packed);
        let out = acpo(&["verify", packed.to_str().expect("u")], tmp.path());
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: tampering must fail the check"
        );
        let dir_out = acpo(&["verify", copy.to_str().expect("u")], tmp.path());
        assert_eq!(dir_out.status.code(), Some(1), "{name}: as a directory too");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let one_byte = tampered("byte", &|d| {
        let f = d.join("run-a/metrics.jsonl");
        let mut bytes = std::fs::read(&f).expect("read");
        bytes[3] ^= 1;
        std::fs::write(&f, bytes).expect("write");
    });
    assert!(
        one_byte.contains("differs: run-a/metrics.jsonl"),
        "{one_byte}"
    );
    let deleted = tampered("deleted", &|d| {
        std::fs::remove_file(d.join("run-b/manifest.yaml")).expect("rm")
    });
    assert!(
        deleted.contains("missing: run-b/manifest.yaml"),
        "{deleted}"
    );
    let added = tampered("added", &|d| {
        std::fs::write(d.join("run-a/extra.txt"), "x").expect("w")
    });
    assert!(added.contains("extra: run-a/extra.txt"), "{added}");

    // A corrupt archive is a failed check, not a crash.
    let mut bytes = std::fs::read(&archive).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    let corrupt = tmp.path().join("corrupt.tar.gz");
    std::fs::write(&corrupt, bytes).expect("write");
    let out = acpo(&["verify", corrupt.to_str().expect("u")], tmp.path());
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A missing target is an input error.
    assert_eq!(
        acpo(&["verify", "no-such.tar.gz"], tmp.path())
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn an_archive_without_checkpoints_verifies_and_holds_no_checkpoint_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let run = fake_run(tmp.path(), "run-a");
    let archive = tmp.path().join("light.tar.gz");
    let out = acpo(
        &[
            "archive",
            run.to_str().expect("u"),
            "--out",
            archive.to_str().expect("u"),
            "--no-checkpoints",
        ],
        tmp.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = acpo(&["verify", archive.to_str().expect("u")], tmp.path());
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let unpacked = tmp.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).expect("mkdir");
    acpo::archive::unpack(&archive, &unpacked).expect("unpack");
    assert!(unpacked.join("run-a/metrics.jsonl").exists());
    assert!(
        !unpacked.join("run-a/checkpoints").exists(),
        "checkpoints left out"
    );
    let sums = std::fs::read_to_string(unpacked.join("run-a/SHA256SUMS")).expect("run sums");
    assert!(
        !sums.contains("checkpoints/"),
        "the run's sums list what is packed: {sums}"
    );
    // The run directory itself keeps its checkpoint.
    assert!(run.join("checkpoints/step_000001/state.json").exists());
}

/// A shipped archive's SHA-256 is the one its sidecar `results/<name>.sha256` gives and the
/// one REPRODUCE.md quotes; returns REPRODUCE.md.
fn checksum_is_quoted(repo: &Path, name: &str) -> String {
    let sha = acpo::checksum::sha256_file(&repo.join("results").join(name)).expect("hash");
    let sidecar =
        std::fs::read_to_string(repo.join(format!("results/{name}.sha256"))).expect("sidecar");
    assert_eq!(sidecar, format!("{sha}  {name}\n"));
    let guide = std::fs::read_to_string(repo.join("REPRODUCE.md")).expect("REPRODUCE.md");
    assert!(
        guide.contains(&sha),
        "REPRODUCE.md quotes {name}'s SHA-256 {sha}"
    );
    guide
}

/// The repository's manifests, which a report `--from` an archive is checked against.
fn experiments() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments")
}

/// `acpo reproduce all --scale mini --from ARCHIVE` into a scratch results/ and figures/ under
/// `tmp`; asserts it succeeded and returns the results root.
fn rebuild_from(shipped: &Path, tmp: &Path) -> PathBuf {
    let results = tmp.join("results");
    let out = acpo(
        &[
            "reproduce",
            "all",
            "--scale",
            "mini",
            "--from",
            shipped.to_str().expect("u"),
            "--results",
            results.to_str().expect("u"),
            "--figures",
            tmp.join("figures").to_str().expect("u"),
            "--experiments",
            experiments().to_str().expect("u"),
        ],
        tmp,
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    results
}

/// The archive shipped in the repository (REPRODUCE.md, tiers 1–2): it verifies, rebuilds
/// Table 1-mini, the speedups, the regime, the paired differences over seeds and the verdict,
/// and those are exactly the blocks REPRODUCE.md quotes, whose SHA-256 line matches the file.
#[test]
fn shipped_archive_verifies_and_rebuilds_the_tables_quoted_in_reproduce() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = repo.join("results/mini.tar.gz");
    let ok = acpo(&["verify", shipped.to_str().expect("u")], repo);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );

    let guide = checksum_is_quoted(repo, "mini.tar.gz");

    let tmp = tempfile::tempdir().expect("tmp");
    let root = rebuild_from(&shipped, tmp.path()).join("from-mini");
    assert_eq!(
        std::fs::read_dir(&root)
            .expect("unpacked")
            .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
            .count(),
        80,
        "the 16 mini runs at seeds 1 to 5"
    );
    assert!(tmp.path().join("figures/from-mini/accuracy.png").exists());
    // Issue #35: the unpacked directory, its reports written in, still verifies.
    let verified = acpo(&["verify", root.to_str().expect("u")], tmp.path());
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );
    let (filled, blocks) =
        acpo::report::doc::splice(Path::new("GUIDE.md"), &guide, &root).expect("splice");
    assert_eq!(
        blocks, 7,
        "table1.md, speedup.md, tails.md, regime.md, seeds.md, verdict.md and power.md are quoted"
    );
    assert_eq!(
        filled, guide,
        "REPRODUCE.md's generated blocks differ from what the archive gives: run `acpo reproduce all --scale mini --from results/mini.tar.gz --doc REPRODUCE.md`"
    );
}

/// The powered runs, shipped as results/mini-powered.tar.gz (xs and s at seeds 1 to 20) and
/// results/mini-powered-ml.tar.gz (m and l at seeds 1 to 23), REPRODUCE.md "Powered": each
/// verifies, its SHA-256 is quoted, and the paired differences, the verdict with its bounds and
/// the power table rebuilt from it are exactly its `from-<name>/*` blocks (filled from the
/// results root, so they never collide with the five-seed blocks); the runs of both read
/// together give the verdict over all four sizes, `from-mini-powered-all/verdict.md`.
#[test]
fn shipped_powered_archives_rebuild_their_verdicts_and_the_four_size_one() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().expect("tmp");
    let mut guide = String::new();
    let mut results = PathBuf::new();
    for (name, seeds) in [("mini-powered", 20), ("mini-powered-ml", 23)] {
        let shipped = repo.join(format!("results/{name}.tar.gz"));
        guide = checksum_is_quoted(repo, &format!("{name}.tar.gz"));
        results = rebuild_from(&shipped, tmp.path());
        let root = results.join(format!("from-{name}"));
        assert_eq!(
            std::fs::read_dir(&root)
                .expect("unpacked")
                .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
                .count(),
            2 * 4 * seeds,
            "2 models x 4 methods x {seeds} seeds"
        );
    }
    let all = results.join("from-mini-powered-all");
    let out = acpo(
        &[
            "report",
            "table1",
            "--runs",
            results.join("from-mini-powered").to_str().expect("u"),
            "--runs",
            results.join("from-mini-powered-ml").to_str().expect("u"),
            "--out",
            all.to_str().expect("u"),
        ],
        tmp.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only these archives' blocks: the five-seed ones are filled from their own folder.
    let (filled, blocks) =
        acpo::report::doc::splice(Path::new("GUIDE.md"), &guide, &results).expect("splice");
    assert_eq!(
        blocks, 7,
        "from-mini-powered{{,-ml}}/{{seeds,verdict,power}}.md and from-mini-powered-all/verdict.md are quoted"
    );
    assert_eq!(
        filled, guide,
        "REPRODUCE.md's powered blocks differ from what the archives give: run `just from-powered-archives`"
    );
    // The same runs with their labels swapped at random within each seed: the verdict's step
    // and accuracy rules take a side at most at their nominal 5 % (plus the binomial slack of
    // 400 trials), on real curves as on the synthetic ones of report::verdict's tests.
    swapped_labels_are_rejected_at_the_nominal_rate(&results.join("from-mini-powered-ml"));
    // One run of a (model, method, seed) read twice is refused, naming both.
    let twice = acpo(
        &[
            "report",
            "table1",
            "--runs",
            results.join("from-mini-powered").to_str().expect("u"),
            "--runs",
            results.join("from-mini-powered").to_str().expect("u"),
            "--out",
            tmp.path().join("twice").to_str().expect("u"),
        ],
        tmp.path(),
    );
    assert_eq!(twice.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("a second run of"),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );
}

fn swapped_labels_are_rejected_at_the_nominal_rate(root: &Path) {
    use acpo::algo::method::AlgorithmKind;
    use acpo::report::{seeds, verdict};
    let runs = acpo::report::load_results(root).expect("runs");
    // per pair, per seed: (baseline curve, -AC curve)
    let mut pairs = Vec::new();
    for model in ["qwen3-mini-m", "qwen3-mini-l"] {
        for (base, ac) in [
            (AlgorithmKind::Ppo, AlgorithmKind::PpoAc),
            (AlgorithmKind::Grpo, AlgorithmKind::GrpoAc),
        ] {
            let of = |m: AlgorithmKind, seed: u64| {
                runs.iter()
                    .find(|r| r.model == model && r.algorithm == m && r.seed == seed)
                    .map(seeds::curve)
            };
            let seeds: Vec<_> = (1..=23u64)
                .map(|s| (of(base, s).expect("baseline"), of(ac, s).expect("-AC")))
                .collect();
            pairs.push(seeds);
        }
    }
    let mut rng = acpo::rng::SplitMix64::new(56);
    let trials = 400;
    let (mut steps, mut accuracy, mut seen) = (0usize, 0usize, 0usize);
    for _ in 0..trials {
        let mut gaps = Vec::new();
        for seeds in &pairs {
            let mut g = Vec::new();
            let mut d = Vec::new();
            for (b, a) in seeds {
                let (b, a) = if rng.next_f64() < 0.5 { (b, a) } else { (a, b) };
                g.push(seeds::step_gap(b, a).expect("curves"));
                let best = |c: &[(usize, f64)]| c.iter().map(|x| x.1).fold(0.0, f64::max);
                d.push(100.0 * (best(a) - best(b)));
            }
            let i = seeds::Interval::of(&d).expect("23 seeds");
            accuracy += usize::from(verdict::accuracy(&i, 0.6).is_directional());
            seen += 1;
            gaps.push(g);
        }
        let refs: Vec<&[i64]> = gaps.iter().map(Vec::as_slice).collect();
        steps += verdict::steps(&refs)
            .iter()
            .filter(|t| t.verdict.is_directional())
            .count();
    }
    let ceiling = |n: usize| 0.05 + 3.09 * (0.05f64 * 0.95 / n as f64).sqrt();
    let (s, a) = (steps as f64 / seen as f64, accuracy as f64 / seen as f64);
    assert!(s <= ceiling(seen), "step rule on swapped labels: {s}");
    assert!(a <= ceiling(seen), "accuracy rule on swapped labels: {a}");
}

/// Issue #23's study, shipped as results/study.tar.gz (REPRODUCE.md, "Beyond the paper"): it
/// verifies, and the six sweeps' reports and their comparison rebuilt from it are exactly the
/// blocks REPRODUCE.md quotes, and figures/study.svg is the comparison's figure.
#[test]
fn shipped_study_archive_rebuilds_the_study_quoted_in_reproduce() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = repo.join("results/study.tar.gz");
    let guide = checksum_is_quoted(repo, "study.tar.gz");

    let tmp = tempfile::tempdir().expect("tmp");
    let results = tmp.path().join("results");
    let figures = tmp.path().join("figures");
    let mut args = vec!["sweep".to_string()];
    for family in ["grpo", "ppo"] {
        for rule in ["ac", "cispo", "gspo"] {
            args.push(format!("sweeps/study-{family}-{rule}.yaml"));
        }
    }
    let path = |p: &Path| p.to_str().expect("utf8").to_string();
    args.extend([
        "--compare".into(),
        "study".into(),
        "--from".into(),
        path(&shipped),
        "--results".into(),
        path(&results),
        "--figures".into(),
        path(&figures),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The specs name their manifests relative to the repository root.
    let out = acpo(&args, repo);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let root = results.join("from-study/sweeps");
    let (filled, blocks) =
        acpo::report::doc::splice(Path::new("GUIDE.md"), &guide, &root).expect("splice");
    assert_eq!(blocks, 7, "study.md and the six sweep.md are quoted");
    assert_eq!(
        filled, guide,
        "REPRODUCE.md's study blocks differ from what the archive gives: run `just study-from-archive`"
    );
    // The figure's text is laid out with the font found at run time (src/plot.rs), so its bytes
    // are compared only where that is DejaVu Sans at the place the shipped one was drawn with
    // (CI's); its numbers are the study.md block's, checked above everywhere.
    let rebuilt = std::fs::read(figures.join("study.svg")).expect("rebuilt figure");
    let dejavu = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");
    if std::env::var_os("ACPO_FONT").is_none() && dejavu.exists() {
        assert_eq!(
            rebuilt,
            std::fs::read(repo.join("figures/study.svg")).expect("shipped figure"),
            "figures/study.svg is not the archive's: run `just study-from-archive`"
        );
    }
}

#[test]
fn reproduce_from_an_archive_unpacks_into_an_emptied_directory() {
    let tmp = tempfile::tempdir().expect("tmp");
    let run = fake_run(tmp.path(), "run-a");
    let archive = tmp.path().join("runs.tar.gz");
    let contents = acpo::archive::Contents { checkpoints: true };
    acpo::archive::archive(&[run], &archive, contents).expect("archive");
    let results = tmp.path().join("results");
    let stale = results.join("from-runs/run-stale");
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join("eval.jsonl"), "{}\n").expect("w");

    let found = acpo::reproduce::from_archive(&archive, &results).expect("from");
    assert!(found.verification.ok(), "{}", found.verification.describe());
    let staged = found.root.clone().expect("verified");
    assert!(staged.join("run-a/metrics.jsonl").exists());
    assert!(stale.exists(), "the earlier folder stays until the commit");
    assert_eq!(found.final_path(&staged), results.join("from-runs"));
    let root = found.commit().expect("commit").expect("verified");
    assert_eq!(root, results.join("from-runs"));
    assert!(root.join("run-a/metrics.jsonl").exists());
    assert!(!staged.exists());
    assert!(
        !stale.exists(),
        "a run of an earlier archive of that name is not mixed in"
    );

    // A tampered archive is reported and nothing is unpacked.
    let bytes = std::fs::read(&archive).expect("read");
    let bad = tmp.path().join("bad.tar.gz");
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).expect("w");
    let found = acpo::reproduce::from_archive(&bad, &results).expect("from");
    assert!(!found.verification.ok());
    assert!(found.root.is_none());
    assert!(!results.join("from-bad").exists());
}

/// A good archive of one fake run, unpacked into `dir/unpacked` for a tamperer to edit.
fn good_archive_unpacked(dir: &Path) -> (PathBuf, PathBuf) {
    let run = fake_run(dir, "run-a");
    let archive = dir.join("good.tar.gz");
    let contents = acpo::archive::Contents { checkpoints: true };
    acpo::archive::archive(&[run], &archive, contents).expect("archive");
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked).expect("mkdir");
    acpo::archive::unpack(&archive, &unpacked).expect("unpack");
    (archive, unpacked)
}

/// Re-packs `dir` without following symbolic links (they go in as links).
fn repack_links(dir: &Path, out: &Path) {
    let file = std::fs::File::create(out).expect("create");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        file,
        flate2::Compression::fast(),
    ));
    tar.follow_symlinks(false);
    tar.append_dir_all(".", dir).expect("append");
    tar.into_inner().expect("tar").finish().expect("gz");
}

fn failed_check(out: &std::process::Output, says: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("FAILED") && stdout.contains(says),
        "{stdout}"
    );
}

/// Issue #17, item 1: a symbolic link in an archive is reported, the archive is refused, and
/// `reproduce --from` writes nothing through it.
#[cfg(unix)]
#[test]
fn an_archive_holding_a_link_fails_and_nothing_is_written_through_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_, unpacked) = good_archive_unpacked(tmp.path());
    let target = tmp.path().join("outside/table1.md");
    std::os::unix::fs::symlink(&target, unpacked.join("run-a/table1.md.tmp")).expect("link");
    // The directory itself fails too: the link is not a regular file.
    failed_check(
        &acpo(&["verify", unpacked.to_str().expect("u")], tmp.path()),
        "not a regular file",
    );
    let crafted = tmp.path().join("crafted.tar.gz");
    repack_links(&unpacked, &crafted);
    failed_check(
        &acpo(&["verify", crafted.to_str().expect("u")], tmp.path()),
        "not a regular file or directory",
    );
    let out = acpo(
        &[
            "reproduce",
            "table1",
            "--scale",
            "mini",
            "--from",
            crafted.to_str().expect("u"),
        ],
        tmp.path(),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!target.exists() && !target.parent().expect("p").exists());
    assert!(!tmp.path().join("results/from-crafted").exists());
}

/// Issue #17, item 1: SHA256SUMS may only name files inside what is verified, and a malformed
/// SHA256SUMS is a failed check (exit 1), not a usage error.
#[test]
fn sums_naming_paths_outside_or_malformed_sums_fail_the_check() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_, unpacked) = good_archive_unpacked(tmp.path());
    let outside = tmp.path().join("outside.txt");
    std::fs::write(&outside, "not part of the archive").expect("w");
    let hash = acpo::checksum::sha256_file(&outside).expect("hash");
    let sums = unpacked.join("SHA256SUMS");
    let good = std::fs::read_to_string(&sums).expect("sums");
    for (line, says) in [
        (format!("{hash}  ../outside.txt\n"), "not a path inside"),
        (
            format!("{hash}  {}\n", outside.display()),
            "not a path inside",
        ),
        (
            "this is not a sums line\n".to_string(),
            "not `<sha256>  <file>`",
        ),
        ("abc  run-a/metrics.jsonl\n".to_string(), "not a SHA-256"),
    ] {
        std::fs::write(&sums, format!("{good}{line}")).expect("w");
        failed_check(
            &acpo(&["verify", unpacked.to_str().expect("u")], tmp.path()),
            says,
        );
        let crafted = tmp.path().join("crafted.tar.gz");
        repack(&unpacked, &crafted);
        failed_check(
            &acpo(&["verify", crafted.to_str().expect("u")], tmp.path()),
            says,
        );
    }
}

/// Issue #17, item 1: each run's own SHA256SUMS is checked, so a file changed after the top
/// sums were redone over it is caught; and the `.sha256` beside an archive must match it.
#[test]
fn run_level_sums_and_the_sidecar_are_checked() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (archive, unpacked) = good_archive_unpacked(tmp.path());
    std::fs::write(
        unpacked.join("run-a/metrics.jsonl"),
        "{\"training/global_step\":9}\n",
    )
    .expect("w");
    acpo::archive::write_sums(&unpacked).expect("top sums redone");
    failed_check(
        &acpo(&["verify", unpacked.to_str().expect("u")], tmp.path()),
        "run-a/metrics.jsonl",
    );

    let side = PathBuf::from(format!("{}.sha256", archive.display()));
    std::fs::write(&side, format!("{}  good.tar.gz\n", "0".repeat(64))).expect("w");
    failed_check(
        &acpo(&["verify", archive.to_str().expect("u")], tmp.path()),
        ".sha256",
    );
}

/// Issue #17, item 9: a decompression bomb is refused from its headers, before anything big is
/// written, the verdict names the archive, and no scratch directory is left behind.
#[test]
fn a_decompression_bomb_is_refused_without_writing_it_and_leaves_no_scratch() {
    use std::io::Read;
    let tmp = tempfile::tempdir().expect("tmp");
    let bomb = tmp.path().join("bomb.tar.gz");
    let zeros = 2 * acpo::archive::UNPACK_ALLOWANCE;
    {
        let file = std::fs::File::create(&bomb).expect("create");
        let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::best(),
        ));
        let mut header = tar::Header::new_gnu();
        header.set_size(zeros);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(
            &mut header,
            "run-a/metrics.jsonl",
            std::io::repeat(0).take(zeros),
        )
        .expect("append");
        tar.into_inner().expect("tar").finish().expect("gz");
    }
    let size = std::fs::metadata(&bomb).expect("meta").len();
    let limit = size * acpo::archive::UNPACK_RATIO + acpo::archive::UNPACK_ALLOWANCE;
    assert!(
        zeros > limit,
        "the premise: {size} bytes unpack to {zeros} > {limit}"
    );
    let scratch_root = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch_root).expect("mkdir");
    let out = Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["verify", bomb.to_str().expect("u")])
        .env("TMPDIR", &scratch_root)
        .current_dir(tmp.path())
        .output()
        .expect("acpo runs");
    failed_check(&out, "decompression bomb");
    assert!(String::from_utf8_lossy(&out.stdout).contains("bomb.tar.gz"));
    let left: Vec<_> = std::fs::read_dir(&scratch_root).expect("ls").collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
}

/// Runs `acpo` with the fault-injection hook set to abort before committing `name`.
fn acpo_killed_at(args: &[&str], cwd: &Path, name: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(cwd)
        .env(acpo::atomic::FAULT_ABORT_BEFORE_COMMIT, name)
        .output()
        .expect("acpo runs")
}

fn temps_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in walk(dir) {
        let name = entry.file_name().map(|n| n.to_string_lossy().to_string());
        if name.is_some_and(|n| acpo::atomic::is_temp(&n)) {
            out.push(entry);
        }
    }
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let p = entry.expect("entry").path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// Issue #17 item 10: a kill at the commit of a figure, a table, an archive or its sidecar
/// (the fault-injection hook `atomic::FAULT_ABORT_BEFORE_COMMIT` aborts right there) leaves the
/// file as it was, never empty or half-written; the next run completes over the leftover
/// temporary; an archive whose sidecar was not yet renewed fails `verify` instead of passing.
#[test]
fn a_kill_at_any_commit_leaves_the_old_file_whole() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/mini.tar.gz");
    let tmp = tempfile::tempdir().expect("tmp");
    let unpacked = tmp.path().join("unpacked");
    let unpacked_figures = unpacked.join("figures");
    let experiments_dir = experiments();
    let from = [
        "reproduce",
        "all",
        "--scale",
        "mini",
        "--from",
        shipped.to_str().expect("u"),
        "--results",
        unpacked.to_str().expect("u"),
        "--figures",
        unpacked_figures.to_str().expect("u"),
        "--experiments",
        experiments_dir.to_str().expect("u"),
    ];
    assert!(acpo(&from, tmp.path()).status.success());
    // The shipped runs as a results tree that `report` rewrites in place.
    let (results, figures) = (tmp.path().join("results"), tmp.path().join("figures"));
    std::fs::create_dir(&results).expect("mkdir");
    std::fs::rename(unpacked.join("from-mini"), results.join("mini")).expect("mv");
    let reproduce = [
        "report",
        "all",
        "--scale",
        "mini",
        "--results",
        results.to_str().expect("u"),
        "--figures",
        figures.to_str().expect("u"),
    ];
    assert!(acpo(&reproduce, tmp.path()).status.success());
    let figure = figures.join("mini/accuracy.png");
    let table = results.join("mini/table1.md");
    for target in [&figure, &table] {
        let good = std::fs::read(target).expect("read");
        std::fs::write(target, b"the previous version").expect("write");
        let name = target.file_name().expect("name").to_str().expect("u");
        let out = acpo_killed_at(&reproduce, tmp.path(), name);
        assert!(!out.status.success(), "{name}: the hook did not fire");
        assert_eq!(
            std::fs::read(target).expect("read"),
            b"the previous version",
            "{name}: a kill at its commit changed it"
        );
        assert!(acpo(&reproduce, tmp.path()).status.success());
        assert_eq!(std::fs::read(target).expect("read"), good, "{name}");
    }
    assert_eq!(temps_under(&figures), Vec::<PathBuf>::new());

    // An archive and its sidecar.
    let run = fake_run(tmp.path(), "fake-run");
    let archive = tmp.path().join("out.tar.gz");
    let make = [
        "archive",
        run.to_str().expect("u"),
        "--out",
        archive.to_str().expect("u"),
    ];
    let verify = ["verify", archive.to_str().expect("u")];
    assert!(acpo(&make, tmp.path()).status.success());
    let (good, good_side) = (
        std::fs::read(&archive).expect("read"),
        std::fs::read(tmp.path().join("out.tar.gz.sha256")).expect("read"),
    );
    std::fs::write(
        run.join("later.txt"),
        "a file added after the first archive",
    )
    .expect("w");
    let out = acpo_killed_at(&make, tmp.path(), "out.tar.gz");
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&archive).expect("read"), good);
    assert_eq!(acpo(&verify, tmp.path()).status.code(), Some(0));
    let out = acpo_killed_at(&make, tmp.path(), "out.tar.gz.sha256");
    assert!(!out.status.success());
    assert_eq!(
        std::fs::read(tmp.path().join("out.tar.gz.sha256")).expect("read"),
        good_side
    );
    failed_check(&acpo(&verify, tmp.path()), "sha256");
    assert!(acpo(&make, tmp.path()).status.success());
    assert_eq!(acpo(&verify, tmp.path()).status.code(), Some(0));
}

/// Issue #35, item 8: a corrupt gzip trailer fails `verify` without the sidecar; a staging
/// directory a killed `verify` left is removed at the next start; `export verl` refuses
/// `--gpus 0` / `--nodes 0` and a directory it did not make, and a dataset that fails leaves
/// no half export.
#[test]
fn archives_and_exports_leave_nothing_half_done() {
    let tmp = tempfile::tempdir().expect("tmp");
    let run = fake_run(tmp.path(), "run-a");
    let archive = tmp.path().join("runs.tar.gz");
    let packed = acpo(
        &[
            "archive",
            run.to_str().expect("u"),
            "--out",
            archive.to_str().expect("u"),
        ],
        tmp.path(),
    );
    assert!(
        packed.status.success(),
        "{}",
        String::from_utf8_lossy(&packed.stderr)
    );
    std::fs::remove_file(tmp.path().join("runs.tar.gz.sha256")).expect("no sidecar");
    let mut bytes = std::fs::read(&archive).expect("r");
    let n = bytes.len();
    bytes[n - 6] ^= 0xFF; // inside the gzip trailer's CRC-32
    std::fs::write(&archive, &bytes).expect("w");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("mkdir");
    // a staging directory of a process that is gone
    let stale = scratch.join(".acpo-staging-4000000-1");
    std::fs::create_dir_all(stale.join("x")).expect("mkdir");
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["verify", archive.to_str().expect("u")])
        .env("TMPDIR", &scratch)
        .output()
        .expect("acpo runs");
    assert_eq!(checked.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&checked.stdout).contains("corrupt archive"),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );
    assert!(
        !stale.exists(),
        "the dead process's staging directory is removed"
    );
    assert!(
        std::fs::read_dir(&scratch).expect("ls").next().is_none(),
        "verify leaves nothing behind"
    );

    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/paper/qwen3-1.7b-grpo.yaml");
    let export = |extra: &[&str], out: &Path| {
        let mut args = vec![
            "export",
            "verl",
            manifest.to_str().expect("u"),
            "--out",
            out.to_str().expect("u"),
        ];
        args.extend(extra);
        acpo(&args, tmp.path())
    };
    for flags in [["--gpus", "0"], ["--nodes", "0"]] {
        let out = tmp.path().join("e0");
        let refused = export(&flags, &out);
        assert_eq!(refused.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&refused.stderr).contains("at least 1"));
        assert!(!out.exists());
    }
    // a dataset that is not there: nothing of the export is written
    let empty = tmp.path().join("no-data");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let out = tmp.path().join("e1");
    let failed = export(&["--data", "--data-dir", empty.to_str().expect("u")], &out);
    assert_eq!(failed.status.code(), Some(2));
    assert!(!out.exists() && !tmp.path().join(".e1.export").exists());
    // an export, then again over it (its own), then into a directory of the user's
    assert!(export(&[], &out).status.success());
    assert!(out.join("launch.sh").is_file() && out.join("fields.md").is_file());
    assert!(export(&[], &out).status.success());
    let mine = tmp.path().join("mine");
    std::fs::create_dir_all(&mine).expect("mkdir");
    std::fs::write(mine.join("notes.txt"), "keep").expect("w");
    let refused = export(&[], &mine);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(mine.join("notes.txt")).expect("r"),
        "keep"
    );
    assert!(!mine.join("launch.sh").exists());
}

/// A tar stream's pieces, written raw (as a hostile archive is): a ustar header of `kind` for a
/// short `path` declaring `size` bytes.
fn raw_header(path: &str, kind: u8, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_path(path).expect("short path");
    h.set_size(size);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_mode(0o755);
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// A header and its data, padded to whole blocks.
fn raw_entry(path: &str, kind: u8, data: &[u8]) -> Vec<u8> {
    let mut v = raw_header(path, kind, data.len() as u64);
    v.extend(data);
    v.resize(v.len().next_multiple_of(512), 0);
    v
}

/// Writes `parts`, then `zeros` zero bytes (a member's data), then the end-of-archive blocks,
/// gzipped at `out`.
fn raw_archive(out: &Path, parts: impl IntoIterator<Item = Vec<u8>>, zeros: u64) {
    use std::io::{Read, Write};
    let file = std::fs::File::create(out).expect("create");
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
    for part in parts {
        gz.write_all(&part).expect("w");
    }
    std::io::copy(&mut std::io::repeat(0).take(zeros), &mut gz).expect("zeros");
    gz.write_all(&[0; 1024]).expect("w");
    gz.finish().expect("gz");
}

/// Issue #58, item 1: hostile archives within a small file — a PAX `size` record above a header
/// of 0 bytes, a GNU long name of 32 MiB, 100,000 directories, a path 200 levels deep — are each
/// refused from their headers by `verify` (a failed check naming the archive and the limit, exit
/// 1, no scratch left) and by `reproduce --from` (nothing unpacked into the results folder).
#[test]
fn hostile_archives_are_refused_within_one_budget_by_verify_and_from() {
    let tmp = tempfile::tempdir().expect("tmp");
    let big = 2 * acpo::archive::UNPACK_ALLOWANCE;
    let pax_size = {
        let record = format!("size={big}\n");
        let mut n = record.len() + 3;
        while format!("{n} {record}").len() != n {
            n += 1;
        }
        format!("{n} {record}")
    };
    type Case<'a> = (&'a str, Vec<Vec<u8>>, u64, &'a str);
    let cases: Vec<Case> = vec![
        (
            "pax-size",
            vec![
                raw_entry("PaxHeader", b'x', pax_size.as_bytes()),
                raw_header("run-a/metrics.jsonl", b'0', 0),
            ],
            big,
            "decompression bomb",
        ),
        (
            "long-name",
            vec![raw_entry("././@LongLink", b'L', &vec![b'a'; 32 << 20])],
            0,
            "GNU long name entry of 33554432 bytes",
        ),
        (
            "many",
            (0..100_000)
                .map(|i| raw_entry(&format!("d{i}/"), b'5', b""))
                .collect(),
            0,
            "refused",
        ),
        (
            "deep",
            vec![
                raw_entry(
                    "././@LongLink",
                    b'L',
                    format!("{}f", "a/".repeat(200)).as_bytes(),
                ),
                raw_entry("x", b'0', b"deep"),
            ],
            0,
            "201 levels",
        ),
    ];
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("mkdir");
    for (name, parts, zeros, says) in cases {
        let archive = tmp.path().join(format!("{name}.tar.gz"));
        raw_archive(&archive, parts, zeros);
        let out = Command::new(env!("CARGO_BIN_EXE_acpo"))
            .args(["verify", archive.to_str().expect("u")])
            .env("TMPDIR", &scratch)
            .current_dir(tmp.path())
            .output()
            .expect("acpo runs");
        failed_check(&out, says);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("{name}.tar.gz")),
            "{name}: {stdout}"
        );
        let left: Vec<_> = std::fs::read_dir(&scratch).expect("ls").collect();
        assert!(left.is_empty(), "{name}: scratch left behind: {left:?}");

        let results = tmp.path().join(format!("results-{name}"));
        let from = acpo(
            &[
                "reproduce",
                "table1",
                "--scale",
                "mini",
                "--from",
                archive.to_str().expect("u"),
                "--results",
                results.to_str().expect("u"),
            ],
            tmp.path(),
        );
        failed_check(&from, says);
        let made: Vec<String> = std::fs::read_dir(&results)
            .expect("ls")
            .map(|e| e.expect("e").file_name().to_string_lossy().to_string())
            .filter(|n| !n.ends_with(".lock"))
            .collect();
        assert!(
            made.is_empty(),
            "{name}: unpacked into the results: {made:?}"
        );
    }
}
