//! Sizes read from flags and files are checked against what they imply before anything is
//! allocated (issue #58): `bench`'s shapes against the machine's memory, `bench
//! memory-predict`'s traces against what a train step can have run.

use std::path::Path;
use std::process::{Command, Output};

fn acpo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("acpo runs")
}

/// Every shape here is inside its flag's range and asks for more memory than any machine has
/// (the smallest, composed attention over 65,536 positions, 512 GiB): refused with exit 2,
/// naming the flag, in well under the time an allocation of that size would take, and no
/// report written. They used to abort (exit 134) inside the allocator.
#[test]
fn bench_shapes_beyond_the_machine_are_refused_naming_the_flag_before_allocating() {
    let out = tempfile::tempdir().expect("tempdir");
    let o = out.path().to_str().expect("utf-8");
    let cases: [(&[&str], &str); 7] = [
        (
            &["attention", "--attention", "composed", "--seq-len", "65536"],
            "--seq-len 65536",
        ),
        (&["attention", "--seq-len", "1000000"], "--seq-len 1000000"),
        (
            &["generate", "--prompt-len", "4194304"],
            "--prompt-len 4194304",
        ),
        (&["generate", "--batch", "1048576"], "--batch 1048576"),
        (
            &["generate", "--long-tail", "--batch", "1048576"],
            "--batch 1048576",
        ),
        (&["train-step", "--batch", "1048576"], "--batch 1048576"),
        (
            &["train-step", "--micro-batch", "1048576"],
            "--micro-batch 1048576",
        ),
    ];
    for (flags, named) in cases {
        let mut args = vec!["bench"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--tiny-only", "--repeats", "1", "--out", o]);
        let started = std::time::Instant::now();
        let run = acpo(&args);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(named) && err.contains("GiB of memory"),
            "{args:?}: {err}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{args:?} took {:?}",
            started.elapsed()
        );
        assert_eq!(
            std::fs::read_dir(out.path()).expect("out").count(),
            0,
            "{args:?} wrote a report"
        );
    }
}

/// The committed traces, copied, with one field of one trace set to `value` (a JSON pointer
/// into the report); the prediction's exit code and stderr.
fn predict_with(dir: &Path, pointer: &str, value: serde_json::Value) -> (Option<i32>, String) {
    let measured = dir.join("measured");
    let _ = std::fs::remove_dir_all(&measured);
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/cpu-memory");
    for entry in std::fs::read_dir(&from).expect("traces") {
        let entry = entry.expect("entry");
        let trace = entry.path().join("train-step.json");
        if trace.is_file() {
            let to = measured.join(entry.file_name());
            std::fs::create_dir_all(&to).expect("mkdir");
            std::fs::copy(&trace, to.join("train-step.json")).expect("copy");
        }
    }
    let target = measured.join("all-b1-t2048/train-step.json");
    let mut report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&target).expect("read")).expect("json");
    *report.pointer_mut(pointer).expect("the field") = value;
    std::fs::write(&target, report.to_string()).expect("write");
    let run = acpo(&[
        "bench",
        "memory-predict",
        "--measured",
        measured.to_str().expect("utf-8"),
        "--out",
        dir.join("out").to_str().expect("utf-8"),
    ]);
    (
        run.status.code(),
        String::from_utf8_lossy(&run.stderr).into_owned(),
    )
}

/// A trace no train step can have written is refused, naming the file and the field: it used
/// to move the prediction (50.6 → 145.6 GiB) and exit 0.
#[test]
fn memory_predict_refuses_traces_no_train_step_wrote() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, err) = predict_with(dir.path(), "/0/settings/batch", 1.into());
    assert_eq!(code, Some(0), "the committed traces, as they are: {err}");
    let huge = serde_json::json!(1u64 << 62);
    let cases = [
        (
            "/0/settings/micro_batch",
            serde_json::json!(0),
            "settings.micro_batch",
        ),
        (
            "/0/settings/seq_len",
            serde_json::json!(0),
            "settings.seq_len",
        ),
        (
            "/0/settings/prompt_len",
            serde_json::json!(4096),
            "settings.prompt_len",
        ),
        (
            "/0/settings/micro_batch",
            huge.clone(),
            "settings.micro_batch",
        ),
        ("/0/settings/seq_len", huge.clone(), "settings.seq_len"),
        ("/0/settings/batch", huge, "settings.batch"),
        ("/0/trace/3/peak", serde_json::json!(u64::MAX), "trace"),
        ("/0/parameters", serde_json::json!(1u64 << 62), "parameters"),
        (
            "/0/trace/3/phase",
            serde_json::json!("layer 18446744073709551615: recompute and backward"),
            "trace",
        ),
    ];
    for (pointer, value, field) in cases {
        let (code, err) = predict_with(dir.path(), pointer, value.clone());
        assert_eq!(code, Some(2), "{pointer} = {value}: {err}");
        assert!(
            err.contains("all-b1-t2048/train-step.json")
                && err.contains(&format!("field `{field}")),
            "{pointer} = {value}: {err}"
        );
    }
}

/// Something named `train-step.json` that is not a regular file (a FIFO would block the read, a
/// directory is no trace) is refused by name, never skipped.
#[cfg(unix)]
#[test]
fn memory_predict_refuses_a_fifo_or_a_directory_named_like_a_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    for kind in ["fifo", "directory"] {
        let measured = dir.path().join(kind);
        let run_dir = measured.join("run");
        std::fs::create_dir_all(&run_dir).expect("mkdir");
        let trace = run_dir.join("train-step.json");
        if kind == "fifo" {
            let made = Command::new("mkfifo").arg(&trace).status().expect("mkfifo");
            assert!(made.success());
        } else {
            std::fs::create_dir(&trace).expect("mkdir");
        }
        let run = acpo(&[
            "bench",
            "memory-predict",
            "--measured",
            measured.to_str().expect("utf-8"),
            "--out",
            dir.path().join("out").to_str().expect("utf-8"),
        ]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{kind}: {err}");
        assert!(
            err.contains("run/train-step.json") && err.contains("not a regular file"),
            "{kind}: {err}"
        );
    }
}
