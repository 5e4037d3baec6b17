//! `acpo model export`: one directory with the weights, the tokenizer's files and a generation
//! config (python/tests/test_export.py loads it in transformers and checks a greedy continuation).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn acpo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("acpo runs")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: Output, says: &str) {
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{err}");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

/// A random model of the smoke config with the char tokenizer (`--char-tokenizer`) or none.
fn init(dir: &Path, name: &str, seed: &str, tokenizer: bool) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "model",
        "init",
        "--config",
        "experiments/smoke/tiny-qwen3.json",
        "--seed",
        seed,
        "--out",
        s(&out),
    ];
    if tokenizer {
        args.push("--char-tokenizer");
    }
    ok(acpo(&args));
    out
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json")
}

fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read")
}

#[test]
fn a_model_directory_exports_with_its_tokenizer_and_a_generation_config() {
    let dir = tempfile::tempdir().expect("tmp");
    let model = init(dir.path(), "model", "1", true);
    let out = dir.path().join("exported");
    let said = ok(acpo(&["model", "export", s(&model), "--out", s(&out)]));
    assert!(said.contains("generation_config.json"), "{said}");
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert_eq!(bytes(&out.join(f)), bytes(&model.join(f)), "{f}");
    }
    // the source's tokenizer config, and the class that reads tokenizer.json as written
    let mut want = json(&model.join("tokenizer_config.json"));
    want["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    assert_eq!(json(&out.join("tokenizer_config.json")), want);
    let g = json(&out.join("generation_config.json"));
    let cfg = json(&model.join("config.json"));
    // the char tokenizer: `<pad>` 0, `</s>` 1; the config's EOS id beside the tokenizer's
    let mut eos: Vec<u64> = vec![cfg["eos_token_id"].as_u64().expect("eos"), 1];
    eos.dedup();
    let got_eos: Vec<u64> = match &g["eos_token_id"] {
        serde_json::Value::Array(a) => a.iter().map(|v| v.as_u64().expect("id")).collect(),
        v => vec![v.as_u64().expect("id")],
    };
    assert_eq!(got_eos, eos);
    assert_eq!(g["pad_token_id"], 0);
    assert_eq!(
        (&g["do_sample"], &g["temperature"], &g["top_p"], &g["top_k"]),
        (
            &serde_json::json!(true),
            &serde_json::json!(1.0),
            &serde_json::json!(1.0),
            &serde_json::json!(0)
        )
    );
    // the export loads as a model (acpo generate reads it)
    ok(acpo(&[
        "generate",
        "--model",
        s(&out),
        "--prompt",
        "1+1=",
        "--temperature",
        "0",
        "--max-new-tokens",
        "4",
    ]));
    // an existing --out is refused, untouched
    let before = bytes(&out.join("model.safetensors"));
    refused(
        acpo(&["model", "export", s(&model), "--out", s(&out)]),
        "already exists",
    );
    assert_eq!(bytes(&out.join("model.safetensors")), before);
    // a model without a tokenizer is refused, naming the file, and nothing is written
    let bare = init(dir.path(), "bare", "2", false);
    let none = dir.path().join("none");
    refused(
        acpo(&["model", "export", s(&bare), "--out", s(&none)]),
        "tokenizer.json",
    );
    assert!(!none.exists());
    let hidden: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "staging left behind: {hidden:?}");
    // with --tokenizer-from it exports
    ok(acpo(&[
        "model",
        "export",
        s(&bare),
        "--tokenizer-from",
        s(&model),
        "--out",
        s(&none),
    ]));
    assert_eq!(
        bytes(&none.join("model.safetensors")),
        bytes(&bare.join("model.safetensors"))
    );
}

#[test]
fn a_run_directory_exports_its_latest_checkpoint_with_its_manifests_tokenizer() {
    let dir = tempfile::tempdir().expect("tmp");
    let model = init(dir.path(), "model", "1", true);
    let run = dir.path().join("run");
    let manifest = std::fs::read_to_string(repo().join("experiments/smoke/smoke-grpo.yaml"))
        .expect("manifest")
        .replace(
            "dir: models/smoke-qwen3-tiny",
            &format!("dir: {}", s(&model)),
        );
    std::fs::create_dir_all(&run).expect("run");
    std::fs::write(run.join("manifest.yaml"), manifest).expect("write");
    // two checkpoints of other weights, and a third one incomplete (no state.json)
    for (step, seed, complete) in [(1, "11", true), (2, "12", true), (3, "13", false)] {
        let ckpt = run.join(format!("checkpoints/step_{step:06}"));
        std::fs::create_dir_all(&ckpt).expect("ckpt");
        init(&ckpt, "policy", seed, false);
        if complete {
            std::fs::write(ckpt.join("state.json"), "{}").expect("state");
        }
    }
    let policy = |step: usize| run.join(format!("checkpoints/step_{step:06}/policy"));
    let latest = dir.path().join("latest");
    ok(acpo(&["model", "export", s(&run), "--out", s(&latest)]));
    assert_eq!(
        bytes(&latest.join("model.safetensors")),
        bytes(&policy(2).join("model.safetensors"))
    );
    assert_eq!(
        bytes(&latest.join("tokenizer.json")),
        bytes(&model.join("tokenizer.json"))
    );
    let first = dir.path().join("first");
    ok(acpo(&[
        "model",
        "export",
        s(&run),
        "--step",
        "1",
        "--out",
        s(&first),
    ]));
    assert_eq!(
        bytes(&first.join("model.safetensors")),
        bytes(&policy(1).join("model.safetensors"))
    );
    let third = dir.path().join("third");
    refused(
        acpo(&[
            "model",
            "export",
            s(&run),
            "--step",
            "3",
            "--out",
            s(&third),
        ]),
        "no complete checkpoint of step 3",
    );
    refused(
        acpo(&[
            "model",
            "export",
            s(&model),
            "--step",
            "1",
            "--out",
            s(&third),
        ]),
        "--step needs a run directory",
    );
    assert!(!third.exists());
}

#[cfg(unix)]
#[test]
fn a_shard_that_is_not_a_regular_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let model = init(dir.path(), "model", "1", true);
    // the weights as a sharded checkpoint whose one shard is a pipe: read, it would never end
    std::fs::remove_file(model.join("model.safetensors")).expect("rm");
    let shard = "model-00001-of-00001.safetensors";
    std::fs::write(
        model.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": {"lm_head.weight": shard}}).to_string(),
    )
    .expect("index");
    let made = Command::new("mkfifo")
        .arg(model.join(shard))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let out = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["model", "export", s(&model), "--out", s(&out)])
        .current_dir(repo())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("acpo runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("acpo model export hangs reading a pipe named as a shard");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("output");
    refused(output, shard);
    assert!(!out.exists());
}
