//! Qwen2 / Qwen3 decoder for training and sampling.
//!
//! Written for this crate after candle-transformers 0.11.1's `qwen2.rs` / `qwen3.rs` (same
//! weight names and block structure), with the changes a trainer needs:
//! 1. Only differentiable ops: RMSNorm, RoPE, softmax and attention are composed of basic tensor
//!    ops. candle's fused `rms_norm`, `rope`, `softmax_last_dim` have no backward, so a model
//!    built on them trains only the weights outside them, silently (a test asserts that every
//!    parameter receives a gradient).
//! 2. Hidden states for *all* positions; logits and log-probs are computed from them in chunks
//!    of positions so a `(B, T, V)` tensor with V = 151,936 is never materialised whole.
//! 3. The KV cache is a value passed in and returned ([`KvCache`]), not state inside the layers,
//!    so one set of weights serves training and sampling.
//! 4. Per-sequence positions and a key-padding mask, so left-padded batches give each sequence
//!    exactly the result it would get alone.
//!
//! Sampling should use a detached model (`Qwen::new(.., detach = true)`): candle has no no-grad
//! mode, and with var-backed weights every decode step would extend the autograd graph (and keep
//! the KV cache alive in it). A detached model on the CPU also keeps a decode-layout copy of each
//! matrix it has decoded with ([`crate::fused::pack_pairs`]).

use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::Embedding;

use super::{Family, Params, QwenConfig, Result};
use crate::algo::token;

/// Large negative bias for masked attention logits. Finite, so a fully masked row (a padding
/// query) gives a uniform distribution instead of NaN.
const MASKED: f64 = -1e9;

/// `y = x·Wᵀ + b` over the last dim. Leading dims are flattened into one matrix product:
/// candle_nn's `Linear` broadcasts W over the batch instead, and the backward of that broadcast
/// materialises a `(B, out, in)` gradient per layer before summing it.
#[derive(Debug, Clone)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    /// Detached models only: the weight in the decode kernel's layout, made on first use.
    decode: Option<DecodeCopy>,
}

impl Linear {
    fn new(weight: Tensor, bias: Option<Tensor>, detached: bool) -> Linear {
        Linear {
            weight,
            bias,
            decode: detached.then(DecodeCopy::default),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(matmul_last(
            x,
            &self.weight,
            self.bias.as_ref(),
            self.decode.as_ref(),
        )?)
    }
}

/// A pair-packed copy of a detached weight ([`crate::fused::pack_pairs`]), made the first time
/// a decode step (a few rows) multiplies by it and shared by the model's clones: +1× the
/// weights' memory for a sampling model, none for a model that never decodes. `None` inside
/// when the kernel does not apply (not CPU f32).
#[derive(Debug, Clone, Default)]
struct DecodeCopy(Arc<OnceLock<Option<Tensor>>>);

impl DecodeCopy {
    /// Packs inside the lock, so sampling groups decoding side by side wait for one copy
    /// instead of each making its own. A failed pack is returned to the caller that tried it;
    /// later calls then use the plain weight (the same numbers).
    fn get(&self, w: &Tensor) -> candle_core::Result<Option<&Tensor>> {
        let mut failed = None;
        let packed = self.0.get_or_init(|| {
            crate::fused::pack_pairs(w).unwrap_or_else(|e| {
                failed = Some(e);
                None
            })
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(packed.as_ref()),
        }
    }
}

/// `x (..., in) · wᵀ (in, out) [+ b]` as one 2-D product.
fn matmul_last(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    decode: Option<&DecodeCopy>,
) -> candle_core::Result<Tensor> {
    let dims = x.dims().to_vec();
    let inp = *dims.last().expect("invariant: at least 1-D");
    let rows = x.elem_count() / inp.max(1);
    let x2 = x.reshape((rows, inp))?;
    // Decoding multiplies a few rows by every weight matrix: stream W instead of packing it,
    // from the decode copy when there is one.
    let small = rows <= crate::fused::SMALL_M;
    let packed = match decode {
        Some(d) if small => d.get(w)?,
        _ => None,
    };
    let y = match packed {
        Some(p) => crate::fused::linear_small_m_packed(&x2, p)?,
        None => crate::fused::linear_small_m(&x2, w)?,
    };
    let y = match y {
        Some(y) => y,
        None => x2.matmul(&w.t()?)?,
    };
    let y = match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    let mut out = dims;
    *out.last_mut().expect("invariant: at least 1-D") = w.dim(0)?;
    y.reshape(out)
}

/// RMSNorm: x / sqrt(mean(x²) + ε) · w, computed in f32 like HF (fused on CPU f32, with its
/// backward; from basic ops elsewhere).
#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(crate::fused::rms_norm(x, &self.weight, self.eps)?)
    }
}

/// cos/sin of rotary embeddings for given positions, `(B, 1, T, D)` each, in `dtype`.
fn rope_tables(
    positions: &Tensor,
    head_dim: usize,
    theta: f64,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / (theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
        .collect();
    let inv_freq = Tensor::from_vec(inv_freq, (1, 1, half), positions.device())?;
    let pos = positions.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?; // (B, T, 1)
    let freqs = pos.broadcast_mul(&inv_freq)?; // (B, T, D/2)
    let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?; // (B, T, D)
    let cos = emb.cos()?.to_dtype(dtype)?.unsqueeze(1)?;
    let sin = emb.sin()?.to_dtype(dtype)?.unsqueeze(1)?;
    Ok((cos, sin))
}

#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    /// `x` `(B, T, H)`, `bias` `(B, 1, T, T_past + T)`; returns the output and this layer's
    /// keys/values `(B, kv_heads, T_past + T, D)`.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        bias: &Tensor,
        past: Option<&(Tensor, Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (b, t, _) = x.dims3()?;
        let split = |y: Tensor, heads: usize| -> Result<Tensor> {
            Ok(y.reshape((b, t, heads, self.head_dim))?)
        };
        let mut q = split(self.q.forward(x)?, self.heads)?;
        let mut k = split(self.k.forward(x)?, self.kv_heads)?;
        let v = split(self.v.forward(x)?, self.kv_heads)?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let q = crate::fused::rope(&q.transpose(1, 2)?.contiguous()?, cos, sin)?; // (B, H, T, D)
        let k = crate::fused::rope(&k.transpose(1, 2)?.contiguous()?, cos, sin)?; // (B, KV, T, D)
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = match past {
            Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
            None => (k, v),
        };
        // Grouped-query attention without repeating K/V: query head h uses KV head h / rep, so
        // the rep query heads of one KV head are stacked as rows of one product with it.
        let rep = self.heads / self.kv_heads;
        let s = k.dim(2)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let qg = q.reshape((b, self.kv_heads, rep * t, self.head_dim))?;
        let scores = qg.matmul(&k.t()?)?; // (B, KV, rep·T, S)
        let scores = scores.reshape((b, self.kv_heads, rep, t, s))?;
        let probs = crate::fused::attention_probs(&scores, bias, scale)?;
        let probs = probs.reshape((b, self.kv_heads, rep * t, s))?;
        let out = probs.matmul(&v)?; // (B, KV, rep·T, D) = (B, H, T, D)
        let out = out
            .reshape((b, self.heads, t, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, self.heads * self.head_dim))?;
        Ok((self.o.forward(&out)?, (k, v)))
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = crate::fused::swiglu(&self.gate.forward(x)?, &self.up.forward(x)?)?;
        self.down.forward(&h)
    }
}

#[derive(Debug, Clone)]
struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// Keys and values of every layer for the positions seen so far, `(B, kv_heads, S, D)` each.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
}

impl KvCache {
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |(k, _)| k.dim(2).unwrap_or(0))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the batch rows `rows` (for dropping finished sequences during sampling).
    pub fn select_rows(&self, rows: &Tensor) -> Result<KvCache> {
        let layers = self
            .layers
            .iter()
            .map(|(k, v)| Ok((k.index_select(rows, 0)?, v.index_select(rows, 0)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache { layers })
    }
}

/// A Qwen2/Qwen3 causal language model.
#[derive(Debug, Clone)]
pub struct Qwen {
    cfg: QwenConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    /// `(V, H)`, no bias; the embedding matrix itself when embeddings are tied.
    lm_head: Linear,
    dtype: DType,
    device: Device,
}

impl Qwen {
    /// Builds the model from named parameters (HF names). `detach` gives a copy for sampling
    /// that shares storage with the trainable weights but records no autograd graph.
    pub fn new(cfg: &QwenConfig, params: &Params, detach: bool) -> Result<Qwen> {
        let family = cfg.family().map_err(|reason| super::ModelError::Config {
            path: "config.json".into(),
            reason,
        })?;
        let get = |name: &str, shape: &[usize]| params.weight(name, shape, detach);
        let (h, v, hd) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim());
        let (nh, nkv, inter) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.intermediate_size,
        );
        let linear = |name: &str, out: usize, inp: usize, bias: bool| -> Result<Linear> {
            let w = get(&format!("{name}.weight"), &[out, inp])?;
            let b = if bias {
                Some(get(&format!("{name}.bias"), &[out])?)
            } else {
                None
            };
            Ok(Linear::new(w, b, detach))
        };
        let norm = |name: &str, n: usize| -> Result<RmsNorm> {
            Ok(RmsNorm {
                weight: get(name, &[n])?,
                eps: cfg.rms_norm_eps,
            })
        };
        let embed_w = get("model.embed_tokens.weight", &[v, h])?;
        let dtype = embed_w.dtype();
        let device = embed_w.device().clone();
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let qk_norm = family == Family::Qwen3;
            let bias = cfg.qkv_bias();
            blocks.push(Block {
                input_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                attn: Attention {
                    q: linear(&format!("{p}.self_attn.q_proj"), nh * hd, h, bias)?,
                    k: linear(&format!("{p}.self_attn.k_proj"), nkv * hd, h, bias)?,
                    v: linear(&format!("{p}.self_attn.v_proj"), nkv * hd, h, bias)?,
                    o: linear(&format!("{p}.self_attn.o_proj"), h, nh * hd, false)?,
                    q_norm: if qk_norm {
                        Some(norm(&format!("{p}.self_attn.q_norm.weight"), hd)?)
                    } else {
                        None
                    },
                    k_norm: if qk_norm {
                        Some(norm(&format!("{p}.self_attn.k_norm.weight"), hd)?)
                    } else {
                        None
                    },
                    heads: nh,
                    kv_heads: nkv,
                    head_dim: hd,
                },
                post_norm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                mlp: Mlp {
                    gate: linear(&format!("{p}.mlp.gate_proj"), inter, h, false)?,
                    up: linear(&format!("{p}.mlp.up_proj"), inter, h, false)?,
                    down: linear(&format!("{p}.mlp.down_proj"), h, inter, false)?,
                },
            });
        }
        let lm_head = if cfg.tie_word_embeddings && !params.contains("lm_head.weight") {
            embed_w.clone()
        } else {
            get("lm_head.weight", &[v, h])?
        };
        Ok(Qwen {
            cfg: cfg.clone(),
            embed: Embedding::new(embed_w, h),
            blocks,
            norm: norm("model.norm.weight", h)?,
            lm_head: Linear::new(lm_head, None, detach),
            dtype,
            device,
        })
    }

    pub fn config(&self) -> &QwenConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Final hidden states `(B, T, H)` for `ids` `(B, T)` at `positions` `(B, T)` (u32), where
    /// `key_valid` `(B, S_past + T)` (u8, 1 = a real token) masks padding keys; attention is
    /// causal in the column index. Returns the extended cache.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        cache: Option<&KvCache>,
    ) -> Result<(Tensor, KvCache)> {
        let (b, t) = ids.dims2()?;
        let past = cache.map_or(0, KvCache::len);
        let bias = attention_bias(key_valid, past, t, self.dtype)?;
        let (cos, sin) = rope_tables(
            positions,
            self.cfg.head_dim(),
            self.cfg.rope_theta(),
            self.dtype,
        )?;
        let mut x = self.embed.forward(ids)?;
        let mut layers = Vec::with_capacity(self.blocks.len());
        for (i, block) in self.blocks.iter().enumerate() {
            let past_kv = cache.and_then(|c| c.layers.get(i));
            let (a, kv) =
                block
                    .attn
                    .forward(&block.input_norm.forward(&x)?, &cos, &sin, &bias, past_kv)?;
            x = (x + a)?;
            x = (&x + block.mlp.forward(&block.post_norm.forward(&x)?)?)?;
            layers.push(kv);
        }
        debug_assert_eq!(x.dims3()?.0, b);
        Ok((self.norm.forward(&x)?, KvCache { layers }))
    }

    /// Logits `(..., V)` from hidden states `(..., H)`, in f32.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.lm_head.forward(hidden)?.to_dtype(DType::F32)?)
    }

    /// Log-probabilities of `targets` `(B, T)` under softmax(logits / temperature) and, if
    /// asked, the entropy, both `(B, T)`; computed `chunk` positions at a time.
    pub fn token_log_probs(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        temperature: f64,
        chunk: usize,
        with_entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let t = hidden.dim(1)?;
        let chunk = chunk.max(1);
        let (mut lps, mut ents) = (Vec::new(), Vec::new());
        let mut start = 0;
        while start < t {
            let len = chunk.min(t - start);
            let logits = self.logits(&hidden.narrow(1, start, len)?)?; // (B, len, V)
            lps.push(token::log_probs(
                &logits,
                &targets.narrow(1, start, len)?,
                temperature,
            )?);
            if with_entropy {
                ents.push(token::entropy(&logits, temperature)?);
            }
            start += len;
        }
        let lp = Tensor::cat(&lps, 1)?;
        let ent = if with_entropy {
            Some(Tensor::cat(&ents, 1)?)
        } else {
            None
        };
        Ok((lp, ent))
    }
}

/// `(B, 1, T, S_past + T)` additive attention bias: 0 where key j is a real token and
/// j ≤ S_past + i (causal in the column index), −1e9 elsewhere.
pub fn attention_bias(key_valid: &Tensor, past: usize, t: usize, dtype: DType) -> Result<Tensor> {
    let valid = key_valid.to_dtype(DType::U8)?.to_vec2::<u8>()?;
    let b = valid.len();
    let s = past + t;
    let mut data = vec![MASKED as f32; b * t * s];
    for (bi, row) in valid.iter().enumerate() {
        if row.len() != s {
            return Err(candle_core::Error::Msg(format!(
                "key_valid has {} columns, expected {s}",
                row.len()
            ))
            .into());
        }
        for i in 0..t {
            for j in 0..=(past + i) {
                if row[j] != 0 {
                    data[(bi * t + i) * s + j] = 0.0;
                }
            }
        }
    }
    Ok(Tensor::from_vec(data, (b, 1, t, s), key_valid.device())?.to_dtype(dtype)?)
}

/// The critic of the PPO types: the policy's backbone with a scalar value head `score`
/// (HF's `*ForTokenClassification` with one label, as verl builds it).
#[derive(Debug, Clone)]
pub struct Critic {
    pub backbone: Qwen,
    head: Linear,
}

impl Critic {
    /// `params` must hold the backbone's weights and `score.weight` `(1, H)` + `score.bias` `(1)`
    /// (see [`super::init::add_value_head`]).
    pub fn new(cfg: &QwenConfig, params: &Params, detach: bool) -> Result<Critic> {
        let backbone = Qwen::new(cfg, params, detach)?;
        let h = cfg.hidden_size;
        let get = |n: &str, s: &[usize]| params.weight(n, s, detach);
        let head = Linear::new(
            get("score.weight", &[1, h])?,
            Some(get("score.bias", &[1])?),
            false,
        );
        Ok(Critic { backbone, head })
    }

    /// Per-position values `(B, T)` in f32.
    pub fn values(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self
            .head
            .forward(hidden)?
            .squeeze(D::Minus1)?
            .to_dtype(DType::F32)?)
    }
}
