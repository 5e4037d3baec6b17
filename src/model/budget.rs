//! What a piece of model work needs in memory, checked before anything is allocated (issue
//! #35): a config, a prompt or a flag whose memory no machine here has is refused with one
//! message naming it, never an allocation that aborts the process or wakes the OOM killer.
//!
//! The estimates are upper bounds of the dominant terms, not measurements: the weights, the
//! composed attention's `(B, H, T, S)` scores and probabilities (the CPU's path), one layer's
//! activations, the KV cache, the logits of a chunk of positions.

use candle_core::Device;

use super::{ModelError, QwenConfig, Result};

/// Positions whose logits the scorer and the sampler hold at once (`score::CHUNK`).
const LOGIT_ROWS: u128 = 256;

impl QwenConfig {
    /// Bytes of the weights in `elem` bytes per parameter.
    pub fn weight_bytes(&self, elem: usize) -> u128 {
        self.parameter_count() * elem as u128
    }

    /// Bytes a forward without a graph over `b` sequences of `t` positions holds at most, in
    /// `elem` bytes per value: its activations ([`QwenConfig::activation_bytes`]) and a KV cache
    /// with room for `reserve` more positions (a sampler's new tokens).
    pub fn forward_bytes(
        &self,
        b: usize,
        t: usize,
        reserve: usize,
        elem: usize,
        composed: bool,
    ) -> u128 {
        self.activation_bytes(b, t, elem, composed) + self.kv_cache_bytes(b, t + reserve, elem)
    }

    /// Bytes a forward's activations over `b` sequences of `t` positions hold at most, in
    /// `elem` bytes per value: one layer's activations, the composed attention's `(b, H, t, t)`
    /// scores and probabilities when `composed`, a chunk of logits.
    pub fn activation_bytes(&self, b: usize, t: usize, elem: usize, composed: bool) -> u128 {
        let (b, t) = (b as u128, t as u128);
        let (h, i, e) = (
            self.hidden_size as u128,
            self.intermediate_size as u128,
            elem as u128,
        );
        let layer = b * t * (6 * h + 4 * i) * e;
        let scores = if composed {
            2 * b * self.num_attention_heads as u128 * t * t * e
        } else {
            0
        };
        let logits = 2 * 4 * b * t.min(LOGIT_ROWS) * self.vocab_size as u128;
        layer + scores + logits
    }

    /// Bytes a KV cache of `b` sequences of `positions` holds, `elem` bytes a number (one for
    /// an FP8 cache of E4M3 bytes).
    pub fn kv_cache_bytes(&self, b: usize, positions: usize, elem: usize) -> u128 {
        b as u128 * positions as u128 * self.kv_bytes_per_position(elem) as u128
    }
}

/// Bytes the `tokenizers` crate may hold while it encodes one text, per byte of that text: at
/// most one token per byte after NFC normalisation (which at most triples a text), and its
/// `Encoding` keeps about 200 bytes per token (ids, offsets, masks, the token strings: 10.5 M
/// tokens peaked at 2.1 GB), rounded up to 256.
const ENCODE_BYTES_PER_BYTE: u128 = 3 * 256;

/// Bytes encoding a text of `text_bytes` bytes holds at most (host memory, whatever the model's
/// device).
pub fn encode_bytes(text_bytes: usize) -> u128 {
    text_bytes as u128 * ENCODE_BYTES_PER_BYTE
}

/// Refuses `need` bytes on `device` when it offers fewer: `what` says what needs them (a field,
/// a flag, a line of a file). Passes where the device cannot say what it offers.
pub fn check(device: &Device, need: u128, what: impl FnOnce() -> String) -> Result<()> {
    match crate::device::available(device) {
        Some(have) if need > have as u128 => Err(ModelError::TooLarge {
            what: what(),
            need: gib(need),
            have: gib(have as u128),
            place: if device.is_cuda() {
                "on the GPU"
            } else {
                "to this process (the host's, within its cgroup and ulimit -v)"
            },
        }),
        _ => Ok(()),
    }
}

fn gib(bytes: u128) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}
