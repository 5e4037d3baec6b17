//! A seeded random model in HF layout (`acpo model init`), and the critic's fresh value head.
//!
//! Initialisation follows transformers' `_init_weights` for Qwen: linear and embedding weights
//! ~ N(0, initializer_range²) (default 0.02), biases 0, RMSNorm weights 1.

use crate::files::AtPath;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};

use super::{ModelError, Params, QwenConfig, Result};
use crate::rng::SplitMix64;
use serde::{Deserialize, Serialize};

/// The tokenizer written with a created model: one the project makes (`char`, `bpe`), or a real
/// model's files (`{dir: …}` or `{repo: …, revision: …}`: its `tokenizer.json` and
/// `tokenizer_config.json`, chat template included; issue #34's paper-shape runs on random
/// weights use the real Qwen tokenizer). Written back as read, so the manifests of `char` and
/// `bpe` keep their fingerprints.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum InitTokenizer {
    Kind(TokenizerKind),
    Files(TokenizerFiles),
}

/// A tokenizer the project builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// One token per printable ASCII character (smoke: a random policy already writes digits).
    Char,
    /// Byte-level BPE trained on the synthetic task's corpus, digits split one per token.
    Bpe,
}

/// Where a real tokenizer's files are.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TokenizerFiles {
    /// A directory holding `tokenizer.json` and `tokenizer_config.json`.
    Dir { dir: PathBuf },
    /// Those files of a hub model (from the cache, downloaded unless offline).
    Hub { repo: String, revision: String },
}

fn normal(
    rng: &mut SplitMix64,
    shape: &[usize],
    std: f64,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    use rayon::prelude::*;
    let n: usize = shape.iter().product();
    // Each value takes two draws, so the values of a block of the tensor start a known number
    // of draws ahead: the blocks run on the pool and the numbers are the ones a single thread
    // draws in order (a 1.7B model's weights in seconds instead of a minute).
    const BLOCK: usize = 1 << 16;
    let mut data = vec![0f32; n];
    let start = rng.clone();
    data.par_chunks_mut(BLOCK).enumerate().for_each(|(b, out)| {
        let mut r = start.ahead(2 * (b * BLOCK) as u64);
        for x in out {
            *x = (r.next_normal() * std) as f32;
        }
    });
    *rng = start.ahead(2 * n as u64);
    Ok(Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?)
}

fn init_std(cfg: &QwenConfig) -> f64 {
    cfg.raw
        .get("initializer_range")
        .and_then(|v| v.as_f64())
        .unwrap_or(0.02)
}

/// How a parameter of a fresh model starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    /// N(0, std²), drawn in [`layout`] order.
    Normal,
    Ones,
    Zeros,
}

/// Every parameter of a Qwen2/Qwen3 model of `cfg` (HF names), its shape and how it starts,
/// in the order [`random_params`] draws them. The memory arithmetic (`perf::memory`) counts
/// parameters from it without making them.
pub fn layout(cfg: &QwenConfig) -> Vec<(String, Vec<usize>, Init)> {
    let (h, v, hd) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim());
    let (nh, nkv, inter) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
    );
    let mut t: Vec<(String, Vec<usize>, Init)> = Vec::new();
    t.push(("model.embed_tokens.weight".into(), vec![v, h], Init::Normal));
    let qwen3 = cfg.model_type == "qwen3";
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        t.push((format!("{p}.input_layernorm.weight"), vec![h], Init::Ones));
        t.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            Init::Ones,
        ));
        for (name, out, inp) in [
            ("q_proj", nh * hd, h),
            ("k_proj", nkv * hd, h),
            ("v_proj", nkv * hd, h),
            ("o_proj", h, nh * hd),
        ] {
            t.push((
                format!("{p}.self_attn.{name}.weight"),
                vec![out, inp],
                Init::Normal,
            ));
            if name != "o_proj" && cfg.qkv_bias() {
                t.push((format!("{p}.self_attn.{name}.bias"), vec![out], Init::Zeros));
            }
        }
        if qwen3 {
            t.push((format!("{p}.self_attn.q_norm.weight"), vec![hd], Init::Ones));
            t.push((format!("{p}.self_attn.k_norm.weight"), vec![hd], Init::Ones));
        }
        for (name, out, inp) in [
            ("gate_proj", inter, h),
            ("up_proj", inter, h),
            ("down_proj", h, inter),
        ] {
            t.push((
                format!("{p}.mlp.{name}.weight"),
                vec![out, inp],
                Init::Normal,
            ));
        }
    }
    t.push(("model.norm.weight".into(), vec![h], Init::Ones));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".into(), vec![v, h], Init::Normal));
    }
    t
}

/// Random parameters for `cfg`, named as HF names them.
pub fn random_params(cfg: &QwenConfig, seed: u64, dtype: DType, device: &Device) -> Result<Params> {
    let mut rng = SplitMix64::from_key(&[seed, 0x1417]);
    let std = init_std(cfg);
    let vars = layout(cfg)
        .into_iter()
        .map(|(name, shape, init)| {
            let x = match init {
                Init::Normal => normal(&mut rng, &shape, std, dtype, device)?,
                Init::Ones => Tensor::ones(shape, dtype, device)?,
                Init::Zeros => Tensor::zeros(shape, dtype, device)?,
            };
            Ok((name, Var::from_tensor(&x)?))
        })
        .collect::<Result<BTreeMap<_, _>>>()?;
    Ok(Params::new(vars))
}

/// Adds a freshly initialised value head (`score.weight` ~ N(0, std²), `score.bias` = 0) to a
/// copy of the policy's parameters: verl's critic starts from the actor's weights.
pub fn add_value_head(policy: &Params, cfg: &QwenConfig, seed: u64) -> Result<Params> {
    let mut rng = SplitMix64::from_key(&[seed, 0xC1171C]);
    let mut critic = BTreeMap::new();
    for (name, var) in policy.vars() {
        // A copy, not a shared Var: actor and critic train separately.
        critic.insert(name.clone(), Var::from_tensor(&var.as_tensor().copy()?)?);
    }
    let (dtype, device) = {
        let (_, first) = policy.vars().next().ok_or_else(|| ModelError::Tensor {
            name: "policy".into(),
            reason: "has no parameters".into(),
        })?;
        (first.dtype(), first.device().clone())
    };
    let w = normal(
        &mut rng,
        &[1, cfg.hidden_size],
        init_std(cfg),
        dtype,
        &device,
    )?;
    critic.insert("score.weight".into(), Var::from_tensor(&w)?);
    critic.insert(
        "score.bias".into(),
        Var::from_tensor(&Tensor::zeros(1, dtype, &device)?)?,
    );
    Ok(Params::new(critic).with_compute(policy.compute_dtype()))
}

/// Writes `config.json` + `model.safetensors` for a random model into `out`.
pub fn write_random_model(config_path: &Path, out: &Path, seed: u64) -> Result<Params> {
    let cfg = QwenConfig::load(config_path)?;
    // the f32 weights, and the largest tensor (the embedding) again while it is written
    let need = cfg.weight_bytes(4) + 4 * cfg.vocab_size as u128 * cfg.hidden_size as u128;
    super::budget::check(&Device::Cpu, need, || {
        format!(
            "a random model of {} ({} parameters in f32)",
            config_path.display(),
            cfg.parameter_count()
        )
    })?;
    std::fs::create_dir_all(out).at(out)?;
    let params = random_params(&cfg, seed, DType::F32, &Device::Cpu)?;
    save_model(&cfg, &params, out)?;
    Ok(params)
}

/// Saves a model in HF layout: `config.json` (as loaded) and `model.safetensors`.
pub fn save_model(cfg: &QwenConfig, params: &Params, out: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(&cfg.raw).map_err(|e| ModelError::Config {
        path: out.join("config.json"),
        reason: e.to_string(),
    })?;
    crate::atomic::write(&out.join("config.json"), text.as_bytes())?;
    params.save(&out.join("model.safetensors"))
}

/// Special tokens of the character-level tokenizer, then printable ASCII.
pub const CHAR_SPECIALS: [&str; 3] = ["<pad>", "</s>", "<unk>"];

/// Vocabulary size of [`write_char_tokenizer`]'s tokenizer (3 specials + 95 printable ASCII).
pub const CHAR_VOCAB: usize = 98;

/// Writes a character-level `tokenizer.json` (BPE with no merges over printable ASCII, so each
/// character is one token) and a `tokenizer_config.json` naming `</s>` as EOS and `<pad>` as
/// padding. Smoke models use it: with a tiny vocabulary a random policy already produces digits,
/// so rewards and advantages are not all zero.
pub fn write_char_tokenizer(out: &Path) -> Result<()> {
    let mut vocab = serde_json::Map::new();
    for (i, t) in CHAR_SPECIALS.iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for (k, c) in (32u8..=126).enumerate() {
        vocab.insert((c as char).to_string(), (CHAR_SPECIALS.len() + k).into());
    }
    let added: Vec<serde_json::Value> = CHAR_SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                               "normalized": false, "special": true})
        })
        .collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    let cfg = serde_json::json!({"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"});
    let json = |v: &serde_json::Value| {
        serde_json::to_string_pretty(v).expect("invariant: JSON values serialise")
    };
    crate::atomic::write(&out.join("tokenizer.json"), json(&tok).as_bytes())?;
    Ok(crate::atomic::write(
        &out.join("tokenizer_config.json"),
        json(&cfg).as_bytes(),
    )?)
}

/// The directory of a real tokenizer's files.
pub fn tokenizer_dir(files: &TokenizerFiles) -> Result<std::path::PathBuf> {
    let dir = match files {
        TokenizerFiles::Dir { dir } => dir.clone(),
        TokenizerFiles::Hub { repo, revision } => {
            crate::hub::tokenizer_files(repo, revision, &crate::hub::HubOptions::from_env())?
        }
    };
    for f in TOKENIZER_FILES {
        if !dir.join(f).is_file() {
            return Err(ModelError::Tokenizer {
                path: dir.join(f),
                reason: "not found (model.init.tokenizer names a directory with tokenizer.json and tokenizer_config.json)".into(),
            });
        }
    }
    Ok(dir)
}

/// The files a real tokenizer is copied from.
pub const TOKENIZER_FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];

/// The tokens of the tokenizer in `dir` (special tokens included).
fn tokenizer_size(dir: &Path) -> Result<usize> {
    let path = dir.join("tokenizer.json");
    let tok = super::tokenizer::read_tokenizer_json(&path)?;
    Ok(tok.get_vocab_size(true))
}

/// Fails, writing nothing, when a model with `vocab_size` embedding rows (from the config at
/// `config`) cannot hold the tokenizer `kind` names.
pub fn check_tokenizer_fits(kind: &InitTokenizer, vocab_size: usize, config: &Path) -> Result<()> {
    let (need, what) = match kind {
        InitTokenizer::Kind(TokenizerKind::Char) => {
            (CHAR_VOCAB, "the character tokenizer's".into())
        }
        InitTokenizer::Kind(TokenizerKind::Bpe) => {
            (BPE_MIN_VOCAB, "a byte-level BPE's minimum".into())
        }
        InitTokenizer::Files(files) => {
            let dir = tokenizer_dir(files)?;
            (
                tokenizer_size(&dir)?,
                format!("the tokenizer of {}'s", dir.display()),
            )
        }
    };
    if vocab_size < need {
        return Err(ModelError::Config {
            path: config.to_owned(),
            reason: format!("vocab_size {vocab_size} is smaller than {what} {need}"),
        });
    }
    Ok(())
}

/// Writes the tokenizer `kind` names for a model with `vocab_size` embedding rows into `out`
/// (`char`; `bpe` trained on the synthetic task's corpus; or a real tokenizer's files copied);
/// returns its size, which is at most `vocab_size`.
pub fn write_tokenizer(
    kind: &InitTokenizer,
    out: &Path,
    vocab_size: usize,
    config: &Path,
) -> Result<usize> {
    check_tokenizer_fits(kind, vocab_size, config)?;
    match kind {
        InitTokenizer::Kind(TokenizerKind::Char) => {
            write_char_tokenizer(out)?;
            Ok(CHAR_VOCAB)
        }
        InitTokenizer::Kind(TokenizerKind::Bpe) => {
            write_bpe_tokenizer(out, &crate::data::synthetic::tokenizer_corpus(), vocab_size)
        }
        InitTokenizer::Files(files) => {
            let dir = tokenizer_dir(files)?;
            for f in TOKENIZER_FILES {
                let bytes = crate::files::read(dir.join(f)).at(dir.join(f))?;
                crate::atomic::write(&out.join(f), &bytes)?;
            }
            tokenizer_size(out)
        }
    }
}

/// Special tokens of the BPE tokenizer: EOS first (id 0), then padding (id 1).
pub const BPE_SPECIALS: [&str; 2] = ["<|endoftext|>", "<|pad|>"];

/// The 256 bytes and the specials: the smallest byte-level BPE vocabulary.
pub const BPE_MIN_VOCAB: usize = 256 + BPE_SPECIALS.len();

/// Trains a byte-level BPE tokenizer on `corpus` (at most `vocab_size` tokens, the 256 bytes
/// and [`BPE_SPECIALS`] included) and writes `tokenizer.json` + `tokenizer_config.json`.
/// Digits are split one per token before BPE, as in Qwen's pre-tokenizer: arithmetic is then
/// learned digit by digit. Training is deterministic (same corpus, same file).
pub fn write_bpe_tokenizer(out: &Path, corpus: &[String], vocab_size: usize) -> Result<usize> {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::{
        AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
        TokenizerBuilder, TokenizerImpl,
    };
    let err = |e: tokenizers::Error| ModelError::Tokenizer {
        path: out.join("tokenizer.json"),
        reason: format!("training the BPE tokenizer: {e}"),
    };
    let min = BPE_MIN_VOCAB;
    if vocab_size < min {
        return Err(ModelError::Tokenizer {
            path: out.join("tokenizer.json"),
            reason: format!(
                "a byte-level BPE needs vocab_size >= {min}, the config has {vocab_size}"
            ),
        });
    }
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(
            BPE_SPECIALS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let pre = Sequence::new(vec![
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
    ]);
    let mut tok: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    > = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None)
        .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(pre)))
        .with_post_processor(None)
        .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())))
        .build()
        .map_err(err)?;
    tok.train(&mut trainer, corpus.iter()).map_err(err)?;
    let size = tok.get_vocab_size(true);
    let json = tok.to_string(true).map_err(err)?;
    crate::atomic::write(&out.join("tokenizer.json"), json.as_bytes())?;
    let cfg = serde_json::json!({"eos_token": BPE_SPECIALS[0], "pad_token": BPE_SPECIALS[1]});
    let text = serde_json::to_string_pretty(&cfg).expect("invariant: JSON values serialise");
    crate::atomic::write(&out.join("tokenizer_config.json"), text.as_bytes())?;
    Ok(size)
}

/// `acpo model init`: a seeded random model in HF layout at `out`, with a tokenizer of `kind`
/// if asked (refused before anything is written when the model's vocabulary cannot hold it).
pub fn create(
    config: &Path,
    out: &Path,
    seed: u64,
    tokenizer: Option<InitTokenizer>,
) -> Result<Created> {
    let vocab_size = QwenConfig::load(config)?.vocab_size;
    if let Some(kind) = &tokenizer {
        check_tokenizer_fits(kind, vocab_size, config)?;
    }
    let params = write_random_model(config, out, seed)?;
    let tokenizer = match tokenizer {
        Some(kind) => {
            let size = write_tokenizer(&kind, out, vocab_size, config)?;
            Some((kind, size))
        }
        None => None,
    };
    Ok(Created {
        dir: out.to_owned(),
        tensors: params.len(),
        parameters: params.count(),
        seed,
        tokenizer,
    })
}

/// Where a real tokenizer came from, for a message.
pub fn tokenizer_source(files: &TokenizerFiles) -> String {
    match files {
        TokenizerFiles::Dir { dir } => dir.display().to_string(),
        TokenizerFiles::Hub { repo, revision } => format!("{repo}@{revision}"),
    }
}

/// What `acpo model init` wrote.
#[derive(Debug, Clone)]
pub struct Created {
    pub dir: std::path::PathBuf,
    pub tensors: usize,
    pub parameters: usize,
    pub seed: u64,
    /// The tokenizer written beside the weights, and its size.
    pub tokenizer: Option<(InitTokenizer, usize)>,
}

impl std::fmt::Display for Created {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some((kind, size)) = &self.tokenizer {
            let name = match kind {
                InitTokenizer::Kind(TokenizerKind::Char) => "character".to_string(),
                InitTokenizer::Kind(TokenizerKind::Bpe) => "BPE".to_string(),
                InitTokenizer::Files(files) => format!("copied ({})", tokenizer_source(files)),
            };
            writeln!(f, "wrote a {name} tokenizer with {size} tokens")?;
        }
        write!(
            f,
            "wrote a random model ({} tensors, {} parameters, seed {}) to {}",
            self.tensors,
            self.parameters,
            self.seed,
            self.dir.display()
        )
    }
}

/// A seeded random model written by `acpo model init` when the model directory is missing,
/// optionally with a tokenizer and a supervised warm start (smoke and mini scales).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInitSpec {
    pub config: PathBuf,
    pub seed: u64,
    pub tokenizer: Option<InitTokenizer>,
    pub warm_start: Option<WarmStartSpec>,
}

/// Supervised fine-tune on worked solutions of the synthetic training set (issue #8): each
/// model starts RL with partial accuracy, the regime where RL has signal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmStartSpec {
    pub steps: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: usize,
    pub max_response_length: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blocks_draw_what_one_thread_draws_in_order() {
        for n in [1usize, 1000, (1 << 16) + 3, 3 << 16] {
            let mut blocks = SplitMix64::from_key(&[7, n as u64]);
            let mut one = blocks.clone();
            let got = normal(&mut blocks, &[n], 0.02, DType::F32, &Device::Cpu)
                .and_then(|t| Ok(t.to_vec1::<f32>()?))
                .expect("normal");
            let want: Vec<f32> = (0..n).map(|_| (one.next_normal() * 0.02) as f32).collect();
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same && got.len() == n, "n = {n}");
            assert_eq!(blocks, one, "the stream continues where one thread's would");
        }
    }
}
