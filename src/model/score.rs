//! Teacher-forced scoring: the log-probability of each next token of given sequences and the
//! policy's entropy at each position, from one forward pass, as HF transformers computes them
//! (`acpo model logprobs`). The parity checks against transformers on any device run through
//! it (`tools/gpu/parity.py`).

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use super::qwen::Qwen;
use super::{ModelError, Params, Precision, QwenConfig, Result};

/// One sequence's scores: `log_probs[i]` = log p(ids[i + 1] | ids[..=i]), `entropy[i]` the
/// entropy (nats) of the distribution at position i; both `ids.len() − 1` long.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scored {
    pub log_probs: Vec<f32>,
    pub entropy: Vec<f32>,
}

/// Positions of the vocabulary projection computed at once (never a whole `(T, V)` f32 copy).
const CHUNK: usize = 256;

/// Scores `ids` (at least two tokens) under `model` at temperature 1.
pub fn teacher_forced(model: &Qwen, ids: &[u32]) -> Result<Scored> {
    if ids.len() < 2 {
        return Err(ModelError::Tensor {
            name: "ids".into(),
            reason: format!(
                "a sequence to score needs at least 2 tokens, got {}",
                ids.len()
            ),
        });
    }
    let dev = model.device();
    let t = ids.len();
    let x = Tensor::from_vec(ids.to_vec(), (1, t), dev)?;
    let pos = Tensor::arange(0u32, t as u32, dev)?.unsqueeze(0)?;
    let valid = Tensor::ones((1, t), candle_core::DType::U8, dev)?;
    let (hidden, _) = model.forward_hidden(&x, &pos, &valid, None)?;
    let hidden = hidden.narrow(1, 0, t - 1)?;
    let targets = Tensor::from_vec(ids[1..].to_vec(), (1, t - 1), dev)?;
    let (lp, ent) = model.token_log_probs(&hidden, &targets, 1.0, CHUNK, true)?;
    let ent = ent.expect("invariant: the entropy was asked for");
    Ok(Scored {
        log_probs: lp.squeeze(0)?.to_vec1::<f32>()?,
        entropy: ent.squeeze(0)?.to_vec1::<f32>()?,
    })
}

/// Why a JSONL file could not be scored: a file of token sequences by a model (here), or of
/// responses by the verifier ([`crate::reward::score_file`]). The one error of `acpo score`.
#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{path}:{line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path}: no responses to score")]
    Empty { path: PathBuf },
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Scores every line `{"ids": [...]}` of `input` with the model directory `dir` (config.json and
/// safetensors; no tokenizer needed) on `device` in
/// `dtype`; one JSON line per input line, `{"log_probs": [...], "entropy": [...]}`.
pub fn score_file(
    dir: &Path,
    input: &Path,
    device: crate::model::spec::Device,
    dtype: crate::model::spec::DType,
) -> std::result::Result<String, ScoreError> {
    let text = crate::files::read_to_string(input).at(input)?;
    // no tokenizer: the sequences are token ids
    let cfg = QwenConfig::load(&dir.join("config.json"))?;
    let precision = Precision::inference(dtype);
    let params = Params::load_dir(dir, precision.master, &super::device(device)?)?
        .with_compute(precision.compute);
    let model = Qwen::new(&cfg, &params, true)?;
    let mut out = String::new();
    for (line, value) in crate::jsonl::values(&text) {
        let bad = |reason: String| ScoreError::Line {
            path: input.to_owned(),
            line,
            reason,
        };
        let value = value.map_err(|e| bad(e.to_string()))?;
        let ids: Vec<u32> = value["ids"]
            .as_array()
            .ok_or_else(|| bad("no `ids` array".into()))?
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&id| id < cfg.vocab_size as u64)
                    .map(|id| id as u32)
                    .ok_or_else(|| bad(format!("`{v}` is not a token id below {}", cfg.vocab_size)))
            })
            .collect::<std::result::Result<_, _>>()?;
        let limit = cfg.max_position_embeddings.unwrap_or(super::MAX_POSITIONS);
        if ids.len() > limit {
            return Err(bad(format!(
                "{} tokens, beyond the model's max_position_embeddings ({limit}, {})",
                ids.len(),
                dir.join("config.json").display()
            )));
        }
        let composed = !model.kernels().flash_attention;
        let need = cfg.forward_bytes(1, ids.len(), 0, model.dtype().size_in_bytes(), composed);
        super::budget::check(model.device(), need, || {
            format!("{}:{line}: scoring {} tokens", input.display(), ids.len())
        })?;
        let scored = teacher_forced(&model, &ids).map_err(|e| bad(e.to_string()))?;
        out.push_str(&serde_json::to_string(&scored).expect("invariant: scores are JSON"));
        out.push('\n');
    }
    Ok(out)
}
