//! The `acpo` binary as a user runs it: exit codes and messages.

use std::path::Path;
use std::process::{Command, Output};

fn acpo(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("acpo runs")
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn check_accepts_every_committed_manifest() {
    let out = acpo(&["check", "experiments"], repo());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok  ")).count() + 1,
        stdout.lines().count()
    );
    assert!(stdout.contains("qwen3-8b-grpo-ac") && stdout.contains("alpha=2"));
}

#[test]
fn check_on_a_broken_manifest_exits_2_naming_file_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read_to_string(repo().join("experiments/paper/qwen3-8b-ppo-ac.yaml"))
        .expect("read");
    std::fs::write(
        dir.path().join("qwen3-8b-ppo-ac.yaml"),
        good.replace("alpha: 3.0", "alpha: -3.0"),
    )
    .expect("write");
    let out = acpo(&["check", "."], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "qwen3-8b-ppo-ac.yaml: field `algorithm.alpha`: must be a finite number > 0, got -3"
        ),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        2,
        "one line per bad file plus the summary: {stderr}"
    );
}

#[test]
fn check_reports_a_missing_path_and_duplicate_run_names() {
    let out = acpo(&["check", "no/such/dir"], repo());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/dir"));

    let dir = tempfile::tempdir().expect("tempdir");
    let good =
        std::fs::read_to_string(repo().join("experiments/paper/qwen3-8b-ppo.yaml")).expect("read");
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        std::fs::write(dir.path().join(sub).join("qwen3-8b-ppo.yaml"), &good).expect("write");
    }
    let out = acpo(&["check", "."], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is already the name of"));
}

#[test]
fn unbuilt_subcommands_say_so_and_exit_2() {
    for (args, issue) in [
        (vec!["train", "experiments/smoke/smoke-ppo.yaml"], "#6"),
        (vec!["score", "--input", "x.jsonl"], "#5"),
        (vec!["reproduce", "table1"], "#7"),
        (vec!["verify", "results.tar.zst"], "#7"),
        (vec!["pmd"], "#9"),
    ] {
        let out = acpo(&args, repo());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            stderr.contains("is not built yet")
                && stderr.contains(issue)
                && stderr.contains("Nothing was run"),
            "{stderr}"
        );
    }
}

#[test]
fn usage_errors_exit_2_and_help_lists_every_subcommand() {
    let out = acpo(&["check", "--no-such-flag"], repo());
    assert_eq!(out.status.code(), Some(2));
    let help = acpo(&["--help"], repo());
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for sub in [
        "check",
        "train",
        "generate",
        "score",
        "eval",
        "report",
        "reproduce",
        "archive",
        "verify",
        "bench",
        "pmd",
        "model",
    ] {
        assert!(
            text.contains(&format!("  {sub}")),
            "--help lacks {sub}:\n{text}"
        );
    }
}
