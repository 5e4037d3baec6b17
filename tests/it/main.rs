//! The integration tests: one binary (see STYLE.md), one module per area.

mod archive;
mod cli;
mod eval;
mod fused;
mod manifest;
mod mini;
mod model;
mod objectives;
mod optim;
mod pmd;
mod report;
mod train;
mod verify;

/// A random Qwen3 with the full Qwen3 vocabulary (so the real tokenizer's ids fit) and
/// everything else tiny, written by `acpo model init` into `dir/model` with the real
/// tokenizer copied beside it. Returns the model directory.
pub fn tiny_full_vocab_model(dir: &std::path::Path) -> std::path::PathBuf {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
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
        std::fs::copy(
            repo.join("../shared/tokenizers/qwen3").join(f),
            model.join(f),
        )
        .expect("copy tokenizer");
    }
    model
}
