//! The integration tests: one binary (one link, one place to look), one module per area.

mod archive;
mod cli;
mod cuda;
mod determinism;
mod doc;
mod eval;
mod export;
mod flags;
mod from;
mod fused;
mod hostile;
mod kernels;
mod layout;
mod limits;
mod manifest;
mod mini;
mod model;
mod objectives;
mod optim;
mod pipeline;
mod pmd;
mod report;
mod sweep;
mod train;
mod verify;
mod verl;

use std::io::Write;
use std::path::{Path, PathBuf};

/// Announces a skipped test where the user sees it: libtest captures `eprintln!` of passing
/// tests, but not writes to the stderr handle itself.
fn skip(test: &str, why: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
}

/// The prepared benchmark and training JSONL files (the repository does not ship them), found
/// the way the product finds them: `ACPO_DATA_DIR`, else the default data directory. None —
/// after one line naming the test and what is missing — when they are not there; CI points
/// `ACPO_DATA_DIR` at the shared copy.
pub fn real_data(test: &str) -> Option<PathBuf> {
    let dir = acpo::data::default_dir();
    if dir.join("math500.jsonl").exists() {
        return Some(dir);
    }
    skip(
        test,
        format_args!(
            "the prepared datasets are not in {} (set ACPO_DATA_DIR to a directory with math500.jsonl, ...)",
            dir.display()
        ),
    );
    None
}

/// The real Qwen3 tokenizer (`tokenizer.json` + `tokenizer_config.json`): `ACPO_QWEN3_TOKENIZER`,
/// else a Qwen/Qwen3-0.6B snapshot in the HF hub cache. None — after one line naming the test
/// and what is missing — when neither has it; CI points `ACPO_QWEN3_TOKENIZER` at the shared copy.
pub fn qwen3_tokenizer(test: &str) -> Option<PathBuf> {
    let has =
        |d: &Path| d.join("tokenizer.json").exists() && d.join("tokenizer_config.json").exists();
    if let Some(dir) = std::env::var_os("ACPO_QWEN3_TOKENIZER").map(PathBuf::from) {
        if has(&dir) {
            return Some(dir);
        }
    }
    let hub = acpo::hub::HubOptions::from_env();
    let cached = hf_hub::Cache::new(hub.cache_dir)
        .repo(hf_hub::Repo::model("Qwen/Qwen3-0.6B".into()))
        .get("tokenizer.json")
        .and_then(|f| f.parent().map(Path::to_owned))
        .filter(|d| has(d));
    if cached.is_none() {
        skip(
            test,
            format_args!("the real Qwen3 tokenizer was not found (set ACPO_QWEN3_TOKENIZER to a directory with tokenizer.json and tokenizer_config.json, or cache Qwen/Qwen3-0.6B)"),
        );
    }
    cached
}

/// A random Qwen3 with the full Qwen3 vocabulary (so the real tokenizer's ids fit) and
/// everything else tiny, written by `acpo model init` into `dir/model` with the real
/// tokenizer copied beside it. Returns the model directory; None (announced) without the
/// real tokenizer.
pub fn tiny_full_vocab_model(dir: &Path, test: &str) -> Option<PathBuf> {
    let tokenizer = qwen3_tokenizer(test)?;
    let cfg = dir.join("tiny.json");
    std::fs::write(
        &cfg,
        r#"{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "eos_token_id": 151645, "hidden_act": "silu"}"#,
    )
    .expect("config");
    let model = dir.join("model");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args([
            "model",
            "init",
            "--config",
            cfg.to_str().expect("utf8"),
            "--out",
            model.to_str().expect("utf8"),
            "--seed",
            "4",
        ])
        .output()
        .expect("acpo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer.join(f), model.join(f)).expect("copy tokenizer");
    }
    Some(model)
}
