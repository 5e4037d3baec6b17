//! `acpo generate`: completions of prompts from a model (a directory or a hub revision),
//! batched, KV-cached and seeded: sample s of prompt p draws from the stream (seed, 0, p, s).

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};

use crate::hub::HubOptions;
use crate::hub::ModelSource;
use crate::model::load::{self, LoadedModel};
use crate::model::qwen::Qwen;
use crate::model::tokenizer::Message;
use crate::model::ModelError;
use crate::rollout::{self, FinishReason, SampleKey, SampleRequest, SamplingParams};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{0}")]
    Flag(String),
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{path}:{line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

impl From<candle_core::Error> for GenerateError {
    fn from(e: candle_core::Error) -> Self {
        GenerateError::Model(e.into())
    }
}

type Result<T> = std::result::Result<T, GenerateError>;

/// What to generate (what `acpo generate`'s flags say).
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// A local model directory in HF layout, or a hub repo id (owner/name).
    pub model: String,
    /// Hub revision (branch, tag or commit) when `model` is a repo id.
    pub revision: String,
    /// One prompt text, or else `input`.
    pub prompt: Option<String>,
    /// A JSONL file of prompts ({"prompt": ...} per line).
    pub input: Option<PathBuf>,
    /// Completions per prompt.
    pub n: usize,
    /// Sampling temperature; 0 is greedy.
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
    pub max_new_tokens: usize,
    pub seed: u64,
    /// Wrap each prompt in the model's chat template.
    pub chat: bool,
    pub device: crate::model::spec::Device,
    pub dtype: crate::model::spec::DType,
    /// Decode over a paged KV cache ([`rollout::PagedOptions`], its defaults).
    pub paged_kv: bool,
}

pub use crate::rollout::{temperature_range, top_p_range};

/// One completion.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generated {
    pub prompt_index: usize,
    pub sample_index: usize,
    pub prompt: String,
    pub completion: String,
    pub finish_reason: FinishReason,
    pub num_tokens: usize,
}

impl GenerateOptions {
    fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_new_tokens: self.max_new_tokens,
        }
    }

    /// The prompts: `--prompt`, or the lines of `--input`. A prompt whose encoding this machine
    /// cannot hold is refused before any is encoded (issue #35): the tokenizer's memory grows
    /// with the text, while a prompt's length in tokens is known only once it is encoded.
    pub fn prompts(&self) -> Result<Vec<String>> {
        let prompts = match (&self.prompt, &self.input) {
            (Some(p), _) => vec![p.clone()],
            (None, Some(path)) => read_prompts(path)?,
            (None, None) => {
                return Err(GenerateError::Flag(
                    "give --prompt TEXT or --input FILE".into(),
                ))
            }
        };
        if let Some((i, longest)) = prompts.iter().enumerate().max_by_key(|(_, p)| p.len()) {
            let need = crate::model::budget::encode_bytes(longest.len());
            crate::model::budget::check(&candle_core::Device::Cpu, need, || {
                let source = match &self.input {
                    Some(path) => path.display().to_string(),
                    None => "--prompt".into(),
                };
                format!("encoding prompt {i} of {source} ({} bytes)", longest.len())
            })?;
        }
        Ok(prompts)
    }

    /// Refuses settings the sampler cannot honour, naming the flag: the ranges clap checks
    /// on the command line ([`temperature_range`], [`top_p_range`]), for callers that build the
    /// options themselves.
    pub fn check(&self) -> Result<()> {
        let p = &self.params();
        for (flag, range, x) in [
            ("--top-p", top_p_range(), p.top_p),
            ("--temperature", temperature_range(), p.temperature),
        ] {
            if !range.holds(x) {
                return Err(GenerateError::Flag(format!(
                    "{flag} must be {}, got {x}",
                    range.describe()
                )));
            }
        }
        if self.n == 0 || p.top_k == Some(0) {
            return Err(GenerateError::Flag(
                "--n and --top-k must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn source(&self) -> Result<ModelSource> {
        if Path::new(&self.model).exists() {
            Ok(ModelSource::Dir(PathBuf::from(&self.model)))
        } else if self.model.matches('/').count() == 1 {
            Ok(ModelSource::Hub {
                repo: self.model.clone(),
                revision: self.revision.clone(),
            })
        } else {
            Err(GenerateError::Flag(format!(
                "--model {}: no such directory, and not a hub id (owner/name)",
                self.model
            )))
        }
    }
}

/// Samples `n` completions of every prompt.
pub fn generate(opts: &GenerateOptions) -> Result<Vec<Generated>> {
    opts.check()?;
    let prompts = opts.prompts()?;
    let loaded = load::load(
        &opts.source()?,
        &HubOptions::from_env(),
        opts.device,
        crate::model::Precision::inference(opts.dtype),
    )?;
    let model = Qwen::new(&loaded.cfg, &loaded.params, true)?;
    let encoded = prompts
        .iter()
        .map(|p| encode(&loaded, p, opts.chat))
        .collect::<Result<Vec<_>>>()?;
    check_size(opts, &loaded, &model, &encoded)?;
    let (mut batch, mut keys, mut index) = (Vec::new(), Vec::<SampleKey>::new(), Vec::new());
    for (pi, ids) in encoded.iter().enumerate() {
        for si in 0..opts.n {
            batch.push(ids.clone());
            keys.push([opts.seed, 0, pi as u64, si as u64]);
            index.push((pi, si));
        }
    }
    let mut request = SampleRequest::new(opts.params())
        .eos(loaded.eos_ids())
        .pad(loaded.tokenizer.pad_id());
    if opts.paged_kv {
        request = request.paged(rollout::PagedOptions::default());
    }
    let completions = rollout::generate(&model, &batch, &keys, &request)?;
    let mut out = Vec::with_capacity(completions.len());
    for ((pi, si), c) in index.into_iter().zip(completions) {
        out.push(Generated {
            prompt_index: pi,
            sample_index: si,
            prompt: prompts[pi].clone(),
            completion: loaded.tokenizer.decode(&c.tokens, true)?,
            finish_reason: c.finish,
            num_tokens: c.tokens.len(),
        });
    }
    Ok(out)
}

/// The most sequences one call samples (`prompts × --n`).
pub use crate::flags::MAX_SEQUENCES;

/// Refuses, before anything is sampled, prompts that with `--max-new-tokens` run past the
/// model's positions, and sequence counts or lengths whose memory the device does not have
/// (issue #35): the KV cache of every sequence and the prefill's attention.
fn check_size(
    opts: &GenerateOptions,
    loaded: &LoadedModel,
    model: &Qwen,
    encoded: &[Vec<u32>],
) -> Result<()> {
    let cfg = &loaded.cfg;
    let limit = cfg
        .max_position_embeddings
        .unwrap_or(crate::model::MAX_POSITIONS);
    for (i, ids) in encoded.iter().enumerate() {
        if ids.len().saturating_add(opts.max_new_tokens) > limit {
            return Err(GenerateError::Flag(format!(
                "prompt {i}: {} tokens + --max-new-tokens {} run past the model's max_position_embeddings ({limit}, {})",
                ids.len(),
                opts.max_new_tokens,
                loaded.dir.join("config.json").display()
            )));
        }
    }
    let sequences = encoded.len().saturating_mul(opts.n);
    if sequences > MAX_SEQUENCES {
        return Err(GenerateError::Flag(format!(
            "--n {}: {} prompts × {} = {sequences} sequences, more than the {MAX_SEQUENCES} one call samples",
            opts.n,
            encoded.len(),
            opts.n
        )));
    }
    let longest = encoded.iter().map(Vec::len).max().unwrap_or(0);
    let composed = !model.kernels().flash_attention;
    let need = cfg.forward_bytes(
        sequences,
        longest,
        opts.max_new_tokens,
        model.dtype().size_in_bytes(),
        composed,
    );
    crate::model::budget::check(model.device(), need, || {
        format!(
            "sampling {sequences} sequences of up to {longest} + {} tokens (--n, --max-new-tokens)",
            opts.max_new_tokens
        )
    })?;
    Ok(())
}

/// A prompt's token ids, checked against the model's vocabulary.
fn encode(loaded: &LoadedModel, prompt: &str, chat: bool) -> Result<Vec<u32>> {
    let text = if chat {
        loaded
            .tokenizer
            .apply_chat_template(&[Message::user(prompt)], true)?
    } else {
        prompt.to_string()
    };
    let ids = loaded.tokenizer.encode(&text)?;
    if ids.is_empty() {
        return Err(GenerateError::Flag("a prompt encodes to no tokens".into()));
    }
    let vocab = loaded.cfg.vocab_size;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(GenerateError::Flag(format!(
            "token id {bad} is outside the model's vocabulary ({vocab}): tokenizer and model do not match"
        )));
    }
    Ok(ids)
}

/// Prompts from a JSONL file with a `prompt` (or `problem`) string per line.
pub fn read_prompts(path: &Path) -> Result<Vec<String>> {
    let text = crate::files::read_to_string(path).at(path)?;
    let mut out = Vec::new();
    for (line, v) in crate::jsonl::values(&text) {
        let bad = |reason: &str| GenerateError::Line {
            path: path.to_owned(),
            line,
            reason: reason.into(),
        };
        let v = v.map_err(|_| bad("not JSON"))?;
        let p = v
            .get("prompt")
            .or_else(|| v.get("problem"))
            .and_then(|p| p.as_str())
            .ok_or_else(|| bad("field `prompt` (a string) is missing"))?;
        out.push(p.to_string());
    }
    if out.is_empty() {
        return Err(GenerateError::Line {
            path: path.to_owned(),
            line: 0,
            reason: "no prompts".into(),
        });
    }
    Ok(out)
}

impl std::fmt::Display for Generated {
    /// A header line, then the completion.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--- prompt {}, sample {} ({:?}, {} tokens)\n{}",
            self.prompt_index,
            self.sample_index,
            self.finish_reason,
            self.num_tokens,
            self.completion
        )
    }
}

/// The completions as JSONL, one object per line.
pub fn jsonl(lines: &[Generated]) -> String {
    lines
        .iter()
        .map(|l| format!("{}\n", serde_json::to_string(l).expect("invariant: JSON")))
        .collect()
}
