//! Issue #47: a report built `--from` an archive stands on every run it expects, each complete,
//! or is refused naming what is missing; it honours `--seeds`; and it writes its report set
//! whole or not at all. The archives are the shipped mini archive tampered with and resealed (so
//! every checksum agrees, as a careful tamperer's would).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The report files `reproduce all` writes into the results root.
const REPORTS: [&str; 9] = [
    "table1.md",
    "table1.tex",
    "table1.csv",
    "regime.md",
    "seeds.md",
    "verdict.md",
    "power.md",
    "speedup.md",
    "tails.md",
];

/// The shipped mini archive (16 manifests × 5 seeds) unpacked into `dir/runs`.
fn unpacked(dir: &Path) -> PathBuf {
    let runs = dir.join("runs");
    std::fs::create_dir_all(&runs).expect("mkdir");
    acpo::archive::unpack(&repo().join("results/mini.tar.gz"), &runs).expect("unpack");
    runs
}

/// The run directories of `runs` whose name starts with `prefix`, sorted.
fn runs_named(runs: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(runs)
        .expect("ls")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    v.sort();
    v
}

/// `runs` resealed (each run's sums and the top ones made again over what is there) and
/// packed as `out`, with no `.sha256` beside it.
fn resealed(runs: &Path, out: &Path) -> PathBuf {
    for run in runs_named(runs, "") {
        acpo::archive::write_sums(&run).expect("reseal run");
    }
    acpo::archive::write_sums(runs).expect("reseal");
    let file = std::fs::File::create(out).expect("create");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        file,
        flate2::Compression::fast(),
    ));
    tar.append_dir_all(".", runs).expect("append");
    tar.into_inner().expect("tar").finish().expect("gz");
    out.to_owned()
}

/// `acpo reproduce ARTIFACT --scale mini --from ARCHIVE` into `dir/results` and `dir/figures`,
/// against the repository's manifests, with `extra` flags.
fn reproduce_from(dir: &Path, artifact: &str, archive: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["reproduce", artifact, "--scale", "mini", "--from"])
        .arg(archive)
        .arg("--results")
        .arg(dir.join("results"))
        .arg("--figures")
        .arg(dir.join("figures"))
        .arg("--experiments")
        .arg(repo().join("experiments"))
        .args(extra)
        .current_dir(dir)
        .output()
        .expect("acpo runs")
}

fn refused(out: &Output, says: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.starts_with("error: ") && !stderr.contains("panicked"));
    for s in says {
        assert!(stderr.contains(s), "`{s}` not said: {stderr}");
    }
}

/// No report file of this run anywhere under `results` or `figures`, nor a staging folder.
fn nothing_reported(dir: &Path, archive_stem: &str) {
    let root = dir.join("results").join(format!("from-{archive_stem}"));
    for f in REPORTS {
        assert!(!root.join(f).exists(), "{f} written by a refused report");
    }
    assert!(!root.join(".report.staging").exists());
    let figures = dir.join("figures").join(format!("from-{archive_stem}"));
    let drawn = std::fs::read_dir(&figures).map_or(0, |d| d.count());
    assert_eq!(drawn, 0, "figures written by a refused report");
}

/// Item 1: a run removed, a run's eval.jsonl removed or emptied, its metrics.jsonl emptied, or
/// a whole manifest's runs removed — each resealed — is refused naming the run and what it
/// lacks, where the report used to come out over the rest; and verifying an archive with no
/// `.sha256` beside it says that its own digest was not checked.
#[test]
fn a_report_from_an_archive_with_a_run_missing_or_cut_short_is_refused_naming_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    type Tamper = fn(&Path) -> String;
    let cases: [(&str, Tamper, &[&str]); 5] = [
        (
            "one run removed",
            |runs| {
                let run = &runs_named(runs, "mini-s-grpo-ac-")[2];
                std::fs::remove_dir_all(run).expect("rm");
                "1 of the 80 runs the report expects are not there".into()
            },
            &["mini-s-grpo-ac-"],
        ),
        (
            "a manifest's five runs removed",
            |runs| {
                for run in runs_named(runs, "mini-m-ppo-ac-") {
                    std::fs::remove_dir_all(run).expect("rm");
                }
                "5 of the 80 runs the report expects are not there".into()
            },
            &["mini-m-ppo-ac-"],
        ),
        (
            "eval.jsonl removed",
            |runs| {
                let run = &runs_named(runs, "mini-xs-grpo-")[0];
                std::fs::remove_file(run.join("eval.jsonl")).expect("rm");
                run.file_name().expect("n").to_string_lossy().into()
            },
            &["not a complete run", "eval.jsonl"],
        ),
        (
            "eval.jsonl emptied",
            |runs| {
                let run = &runs_named(runs, "mini-l-ppo-")[4];
                std::fs::write(run.join("eval.jsonl"), "").expect("w");
                run.file_name().expect("n").to_string_lossy().into()
            },
            &[
                "not a complete run",
                "eval.jsonl",
                "no evaluation at step 0",
            ],
        ),
        (
            "metrics.jsonl emptied",
            |runs| {
                let run = &runs_named(runs, "mini-s-ppo-")[1];
                std::fs::write(run.join("metrics.jsonl"), "").expect("w");
                run.file_name().expect("n").to_string_lossy().into()
            },
            &["not a complete run", "metrics.jsonl", "step 1"],
        ),
    ];
    for (i, (what, tamper, says)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("case{i}"));
        let runs = unpacked(&dir);
        let named = tamper(&runs);
        let archive = resealed(&runs, &dir.join("tampered.tar.gz"));
        let out = reproduce_from(&dir, "all", &archive, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("files match SHA256SUMS") && stdout.contains("tampered.tar.gz.sha256"),
            "{what}: the resealed archive verifies, saying no sidecar was there: {stdout}"
        );
        assert!(
            stdout.contains("was not checked"),
            "{what}: the OK says the archive's own digest was not checked: {stdout}"
        );
        let mut all: Vec<&str> = says.to_vec();
        all.push(&named);
        refused(&out, &all);
        nothing_reported(&dir, "tampered");
    }
}

/// Item 11: `--seeds` is honoured `--from` an archive: the archive must hold exactly that many
/// seeds of every run (fewer or more are refused, naming the runs), out-of-range counts are
/// refused naming the flag, and the archive's own count is the default.
#[test]
fn reproduce_from_honours_seeds() {
    let tmp = tempfile::tempdir().expect("tmp");
    let shipped = repo().join("results/mini.tar.gz");
    for (seeds, says) in [
        ("0", "--seeds"),
        ("4097", "--seeds"),
        ("18446744073709551615", "--seeds"),
        ("-1", "--seeds"),
        ("6", "16 of the 96 runs the report expects are not there"),
        ("4", "holds 16 runs the report does not expect"),
        ("300", "more than the 4096 runs"),
    ] {
        let out = reproduce_from(tmp.path(), "table1", &shipped, &["--seeds", seeds]);
        refused(&out, &[says]);
        nothing_reported(tmp.path(), "mini");
    }
    let out = reproduce_from(tmp.path(), "table1", &shipped, &["--seeds", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(
        "all 80 runs the report expects are there and complete (16 manifests × 5 seeds)"
    ));
}

/// Item 2: a report that fails on the way (here: one run's tail histogram is not JSON, found
/// only while the tables are made) writes none of its set, neither `--from` an archive nor over
/// an earlier report of a results directory, whose files stay as they were.
#[test]
fn a_failed_report_leaves_no_part_of_its_set() {
    let tmp = tempfile::tempdir().expect("tmp");
    let runs = unpacked(tmp.path());
    for run in runs_named(&runs, "mini-xs-grpo-ac-") {
        std::fs::write(run.join("tails/step_000003.json"), "not json").expect("w");
    }
    let archive = resealed(&runs, &tmp.path().join("broken.tar.gz"));
    let out = reproduce_from(tmp.path(), "all", &archive, &[]);
    refused(&out, &["step_000003.json"]);
    nothing_reported(tmp.path(), "broken");

    // The same runs as a results directory with an earlier report: it stays whole.
    let results = tmp.path().join("results-dir");
    std::fs::create_dir_all(&results).expect("mkdir");
    std::fs::rename(&runs, results.join("mini")).expect("mv");
    let root = results.join("mini");
    for f in REPORTS {
        std::fs::write(root.join(f), format!("the earlier {f}")).expect("w");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["report", "all", "--scale", "mini", "--results"])
        .arg(&results)
        .arg("--figures")
        .arg(tmp.path().join("figures-dir"))
        .output()
        .expect("acpo runs");
    refused(&out, &["step_000003.json"]);
    for f in REPORTS {
        assert_eq!(
            std::fs::read_to_string(root.join(f)).expect("kept"),
            format!("the earlier {f}"),
            "{f}: a failed report replaced it"
        );
    }
    assert!(!root.join(".report.staging").exists());
    assert!(!tmp.path().join("figures-dir/mini/accuracy.png").exists());
}

/// Every file under `dir` (relative path → bytes).
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("ls") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).expect("under").to_owned();
                out.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    out
}

/// Issue #58, item 3: a good `--from` fills `from-mini/`; a second call with an archive of the
/// same name missing a run (resealed, so it verifies) is refused (exit 2) and leaves the earlier
/// runs and reports byte for byte, with nothing staged left beside them; a call while another
/// `--from` holds the folder's lock is refused naming it, changing nothing.
#[test]
fn a_failing_from_keeps_the_last_good_reports_and_one_from_at_a_time_writes_a_folder() {
    let tmp = tempfile::tempdir().expect("tmp");
    let shipped = repo().join("results/mini.tar.gz");
    let good = reproduce_from(tmp.path(), "table1", &shipped, &[]);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    let results = tmp.path().join("results");
    let root = results.join("from-mini");
    assert!(String::from_utf8_lossy(&good.stdout)
        .contains(&format!("wrote {}", root.join("table1.md").display())));
    let before = snapshot(&root);
    assert!(before.contains_key(Path::new("table1.md")));
    assert!(before.contains_key(Path::new("SHA256SUMS")));

    let other = tmp.path().join("other");
    let runs = unpacked(&other);
    std::fs::remove_dir_all(&runs_named(&runs, "mini-s-grpo-ac-")[2]).expect("rm");
    let short = resealed(&runs, &other.join("mini.tar.gz"));
    let out = reproduce_from(tmp.path(), "table1", &short, &[]);
    refused(
        &out,
        &[
            "1 of the 80 runs the report expects are not there",
            "mini-s-grpo-ac-",
        ],
    );
    assert!(
        snapshot(&root) == before,
        "the earlier runs and reports changed"
    );
    let mut left: Vec<String> = std::fs::read_dir(&results)
        .expect("ls")
        .map(|e| e.expect("e").file_name().to_string_lossy().to_string())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [".from-mini.lock", "from-mini"],
        "staging left behind"
    );

    let held = acpo::run::lock::acquire(&root, acpo::run::lock::Wait::NoWait)
        .expect("lock")
        .expect("free");
    let out = reproduce_from(tmp.path(), "table1", &shipped, &[]);
    refused(&out, &["another `--from`", "from-mini"]);
    assert!(snapshot(&root) == before, "written under a held lock");
    drop(held);
    let again = reproduce_from(tmp.path(), "table1", &shipped, &[]);
    assert!(again.status.success());
    assert!(
        snapshot(&root) == before,
        "the same archive, the same folder"
    );
}
