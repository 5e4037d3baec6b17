//! The batch: which problems a step trains on (a seeded data order, resumable by its cursor) and
//! how prompts and responses are laid out for the model.

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::Result;
use crate::model::qwen::Qwen;
use crate::rng::SplitMix64;

/// Log-prob chunk over positions: bounds the (B, chunk, V) logits.
pub const LOGIT_CHUNK: usize = 64;

/// Where in the data the next batch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCursor {
    pub epoch: u64,
    pub index: usize,
}

/// The order of the training problems in `epoch` (Fisher–Yates on the (seed, epoch) stream).
pub(crate) fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng = SplitMix64::from_key(&[seed, 0xDA7A, epoch]);
        for i in (1..n).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// Takes the next `count` problem indices, moving the cursor (wrapping into the next epoch).
pub(crate) fn next_batch(
    cursor: &mut DataCursor,
    count: usize,
    n: usize,
    seed: u64,
    shuffle: bool,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(count);
    let mut order = epoch_order(n, seed, cursor.epoch, shuffle);
    while out.len() < count {
        if cursor.index >= n {
            cursor.epoch += 1;
            cursor.index = 0;
            order = epoch_order(n, seed, cursor.epoch, shuffle);
        }
        out.push(order[cursor.index]);
        cursor.index += 1;
    }
    out
}

/// A batch of responses laid out for the model: left-padded prompts, right-padded responses.
pub struct Layout {
    pub ids: Tensor,       // (N, P + R) u32
    pub positions: Tensor, // (N, P + R) u32
    pub valid: Tensor,     // (N, P + R) u8
    pub targets: Tensor,   // (N, R) u32: the response tokens
    pub mask: Tensor,      // (N, R) f32
    pub prompt_len: usize, // P
}

pub fn layout(
    prompts: &[&Vec<u32>],
    responses: &[&Vec<u32>],
    pad: u32,
    device: &Device,
) -> Result<Layout> {
    let n = prompts.len();
    let p = prompts.iter().map(|x| x.len()).max().unwrap_or(0);
    let r = responses.iter().map(|x| x.len()).max().unwrap_or(0).max(1);
    let (mut ids, mut pos, mut valid, mut targets, mut mask) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (pr, rs) in prompts.iter().zip(responses) {
        let pad_left = p - pr.len();
        ids.extend(std::iter::repeat_n(pad, pad_left).chain(pr.iter().copied()));
        ids.extend(
            rs.iter()
                .copied()
                .chain(std::iter::repeat_n(pad, r - rs.len())),
        );
        pos.extend((0..p + r).map(|j| j.saturating_sub(pad_left) as u32));
        valid.extend((0..p + r).map(|j| u8::from(j >= pad_left && j < p + rs.len())));
        targets.extend(
            rs.iter()
                .copied()
                .chain(std::iter::repeat_n(pad, r - rs.len())),
        );
        mask.extend((0..r).map(|j| if j < rs.len() { 1f32 } else { 0.0 }));
    }
    Ok(Layout {
        ids: Tensor::from_vec(ids, (n, p + r), device)?,
        positions: Tensor::from_vec(pos, (n, p + r), device)?,
        valid: Tensor::from_vec(valid, (n, p + r), device)?,
        targets: Tensor::from_vec(targets, (n, r), device)?,
        mask: Tensor::from_vec(mask, (n, r), device)?,
        prompt_len: p,
    })
}

impl Layout {
    pub fn rows(&self, start: usize, len: usize) -> Result<Layout> {
        Ok(Layout {
            ids: self.ids.narrow(0, start, len)?,
            positions: self.positions.narrow(0, start, len)?,
            valid: self.valid.narrow(0, start, len)?,
            targets: self.targets.narrow(0, start, len)?,
            mask: self.mask.narrow(0, start, len)?,
            prompt_len: self.prompt_len,
        })
    }

    /// Hidden states that predict the response tokens: positions P−1 … P+R−2.
    pub fn response_hidden(&self, model: &Qwen) -> Result<Tensor> {
        let (hidden, _) = model.forward_hidden(&self.ids, &self.positions, &self.valid, None)?;
        self.response_of(&hidden)
    }

    /// The response-predicting positions P−1 … P+R−2 of the hidden states of every position.
    pub fn response_of(&self, hidden: &Tensor) -> Result<Tensor> {
        let r = self.targets.dim(1)?;
        Ok(hidden.narrow(1, self.prompt_len - 1, r)?)
    }
}
