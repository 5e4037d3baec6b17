//! The embedding lookup's backward written once (issue #59, item 2): the gradient of the
//! embedding matrix `(V, H)` from the gradient `dy` of the looked-up rows, with the tied
//! lm_head's share as its starting value, in f32 for an f32 master.
//!
//! Under autograd, `embedding(ids)` is `W.index_select(ids)`, whose backward is `index_add` of
//! the rows of `dy` into W's gradient so far (candle-core 0.11, `backprop.rs`): zero-filled, or,
//! with tied embeddings, holding the lm_head's share, which reaches W first
//! (`Qwen::checkpointed_backward`). Row t of the gradient is then
//!
//! ```text
//! grad[t] = ((0 + base[t]) + dy[p₁]) + dy[p₂] + …      p₁ < p₂ < … the positions holding token t
//! ```
//!
//! added in position order (`base` the lm_head's share, or nothing). On CUDA that route costs a
//! zero fill of `(V, H)`, candle's `index_add` kernel (one thread a column, each walking every
//! position in turn: 2,048 threads on two SMs for 18,440 positions at 2 × 9,220 tokens, ~7 ms by
//! the H200 run's phase times, kernels/NOTES.md version 18),
//! the sum with the lm_head's share, and the cast of the bf16 result to the f32 master: several
//! passes over a matrix of 311 M numbers at Qwen3's vocabulary. Here one pass writes the f32
//! gradient: each row's positions gathered on the host (a counting sort of the ids, so each
//! row's are in position order), one thread a column of a row adding them in that order
//! (`kernels/embedding.cu`). The sum is the formula above in f32: in f32 the bits of the autograd
//! route on every device (tests/it/fused.rs, and tests/it/cuda.rs against candle's CUDA route);
//! from bf16 inputs, f32 sums of their exact values, where autograd's route rounds to bf16 after
//! each add.

use candle_core::{DType, Device, Result, Tensor, D};

/// The gradient `(V, H)` in f32 of an embedding matrix from the gradient `dy` `(..., H)` of its
/// lookup at the ids `rows` grouped, starting from `base` `(V, H)` (the tied lm_head's share, in
/// `dy`'s dtype) where given: row t is `0 + base[t]` plus the rows of `dy` whose id is t, in
/// position order, summed in f32 (module docs).
pub fn embedding_backward(rows: &TokenRows, dy: &Tensor, base: Option<&Tensor>) -> Result<Tensor> {
    if !embedding_backward_applies(dy) {
        candle_core::bail!(
            "embedding backward: a gradient of {:?} (f32 or bf16 only: the sums are f32)",
            dy.dtype()
        );
    }
    let (vocab, h) = (rows.vocab(), dy.dim(D::Minus1)?);
    let n = dy.elem_count() / h.max(1);
    if n != rows.positions {
        candle_core::bail!(
            "embedding backward: {} ids for {n} rows of the gradient {:?}",
            rows.positions,
            dy.dims()
        );
    }
    if let Some(b) = base {
        if b.dims() != [vocab, h] || b.dtype() != dy.dtype() {
            candle_core::bail!(
                "embedding backward: the lm_head's gradient {:?} {:?}, the embedding's ({vocab}, {h}) {:?}",
                b.dims(),
                b.dtype(),
                dy.dtype()
            );
        }
    }
    #[cfg(feature = "cuda")]
    if dy.device().is_cuda() {
        return cuda::embedding_backward(rows, dy, h, base);
    }
    let device = dy.device().clone();
    let dy = host_f32(dy)?;
    let grad = match base {
        Some(b) => host_f32(b)?,
        None => vec![0f32; vocab * h],
    };
    let grad = embedding_backward_host(rows, &dy, h, grad, base.is_some());
    Tensor::from_vec(grad, (vocab, h), &device)
}

/// Whether [`embedding_backward`] takes a gradient `dy`: in f32 or bf16, whose numbers
/// f32 sums hold exactly (an f64 gradient keeps autograd's route).
pub fn embedding_backward_applies(dy: &Tensor) -> bool {
    matches!(dy.dtype(), DType::F32 | DType::BF16)
}

/// Where each vocabulary row's positions are: `order[starts[t]..starts[t + 1]]` are the
/// positions holding token t, ascending (a stable counting sort of the ids).
pub struct TokenRows {
    /// `vocab + 1` offsets into `order`.
    pub starts: Vec<u32>,
    /// The positions, grouped by token, each group in position order.
    pub order: Vec<u32>,
    /// How many ids were grouped (`u32::MAX` ones included, which no row takes).
    pub positions: usize,
}

impl TokenRows {
    /// The ids of a lookup (u32, any shape; read to the host, which waits for the device's
    /// queue: built where that queue is short, before a backward), grouped.
    pub fn of(ids: &Tensor, vocab: usize) -> Result<TokenRows> {
        TokenRows::new(&ids.flatten_all()?.to_vec1::<u32>()?, vocab)
    }

    /// Groups the positions of `ids` by token. An id of `u32::MAX` is candle's padding (its
    /// lookup a zero row, `index_add` skipping it): in no row. Any other id at or past `vocab`
    /// is an error naming its position.
    pub fn new(ids: &[u32], vocab: usize) -> Result<TokenRows> {
        if u32::try_from(ids.len()).is_err() || u32::try_from(vocab).is_err() {
            candle_core::bail!(
                "embedding backward: {} positions over {vocab} rows are more than one launch",
                ids.len()
            );
        }
        let mut starts = vec![0u32; vocab + 1];
        for (p, &id) in ids.iter().enumerate() {
            if id == u32::MAX {
                continue;
            }
            if id as usize >= vocab {
                candle_core::bail!(
                    "embedding backward: token id {id} at position {p} is past the vocabulary of {vocab}"
                );
            }
            starts[id as usize + 1] += 1;
        }
        for t in 0..vocab {
            starts[t + 1] += starts[t];
        }
        let mut next = starts.clone();
        let mut order = vec![0u32; starts[vocab] as usize];
        for (p, &id) in ids.iter().enumerate().filter(|(_, &id)| id != u32::MAX) {
            let slot = &mut next[id as usize];
            order[*slot as usize] = p as u32;
            *slot += 1;
        }
        Ok(TokenRows {
            starts,
            order,
            positions: ids.len(),
        })
    }

    /// The vocabulary's size.
    pub fn vocab(&self) -> usize {
        self.starts.len() - 1
    }
}

/// `t`'s numbers on the host in f32 (exact from bf16), in order.
fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()
}

/// The CPU twin of `kernels/embedding.cu`: into `grad` `(V, h)`, holding the lm_head's share
/// where `has_base` (else zeros), row t becomes `0 + grad[t]` plus the rows of `dy` `(N, h)` at
/// t's positions, in position order, in f32.
pub fn embedding_backward_host(
    rows: &TokenRows,
    dy: &[f32],
    h: usize,
    mut grad: Vec<f32>,
    has_base: bool,
) -> Vec<f32> {
    if has_base {
        // as the zero-filled gradient the lm_head's share is added into (−0 becomes +0)
        for g in grad.iter_mut() {
            *g += 0.0;
        }
    }
    for (t, out) in grad.chunks_mut(h.max(1)).enumerate() {
        let (a, b) = (rows.starts[t] as usize, rows.starts[t + 1] as usize);
        for &p in &rows.order[a..b] {
            for (o, &d) in out
                .iter_mut()
                .zip(&dy[p as usize * h..(p as usize + 1) * h])
            {
                *o += d;
            }
        }
    }
    grad
}

/// The CUDA launch of `kernels/embedding.cu` (the `cuda` feature); the CPU twin is
/// [`embedding_backward_host`].
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor};

    use super::TokenRows;
    use crate::fused::launch::{dtype_of, grid_dim, kernel, ptx, suffix, view, with_type};

    const PTX: (&str, &str) = ptx!("embedding");

    /// Chunks of a block's columns a launch walks at most (the grid-stride loop takes the rest).
    const MAX_BLOCKS: usize = 1 << 16;

    /// The gradient of a `(V, h)` embedding from `dy` and the positions `rows` groups.
    pub fn embedding_backward(
        rows: &TokenRows,
        dy: &Tensor,
        h: usize,
        base: Option<&Tensor>,
    ) -> Result<Tensor> {
        let meta: Vec<u32> = rows.starts.iter().chain(&rows.order).copied().collect();
        let meta = Tensor::from_vec(meta, rows.starts.len() + rows.order.len(), dy.device())?;
        let dy = dy.contiguous()?;
        let base = base.map(Tensor::contiguous).transpose()?;
        let op = Grad {
            base,
            vocab: rows.vocab(),
            h,
        };
        dy.apply_op2_no_bwd(&meta, &op)?.reshape((rows.vocab(), h))
    }

    /// `embedding_grad_*` on `(dy, meta)`: meta is the starts then the order, one upload.
    struct Grad {
        base: Option<Tensor>,
        vocab: usize,
        h: usize,
    }

    impl CustomOp2 for Grad {
        fn name(&self) -> &'static str {
            "acpo-embedding-grad"
        }

        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &Layout,
            _: &candle_core::CpuStorage,
            _: &Layout,
        ) -> Result<(candle_core::CpuStorage, Shape)> {
            candle_core::bail!("{}: the CPU takes embedding_backward_host", self.name())
        }

        fn cuda_fwd(
            &self,
            dy: &CudaStorage,
            ldy: &Layout,
            meta: &CudaStorage,
            lmeta: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let what = self.name();
            let sfx = suffix(dtype_of(dy), what)?;
            let base = self.base.as_ref().map(|b| b.storage_and_layout());
            with_type!(dtype_of(dy), T, {
                let dev = &dy.device;
                let dyv = view::<T>(dy, ldy, what)?;
                let mv = view::<u32>(meta, lmeta, what)?;
                let basev = match &base {
                    Some((st, l)) => match &**st {
                        Storage::Cuda(s) => Some(view::<T>(s, l, what)?),
                        _ => candle_core::bail!("{what}: the lm_head's gradient on another device"),
                    },
                    None => None,
                };
                let len = self.vocab * self.h;
                // SAFETY: every element is written (each (row, column) by one thread).
                let mut out = unsafe { dev.alloc::<f32>(len) }?;
                let f = kernel!(dev, &format!("embedding_grad_{sfx}"), PTX)?;
                let threads = crate::fused::launch::ELEM_THREADS as usize;
                let chunks = self.vocab * self.h.div_ceil(threads);
                let has_base = i32::from(basev.is_some());
                let (vocab, h) = (self.vocab, self.h);
                let mut b = f.builder();
                // Without a base the kernel never reads it: dy stands in for the pointer.
                b.arg(&dyv);
                match &basev {
                    Some(v) => b.arg(v),
                    None => b.arg(&dyv),
                };
                b.arg(&has_base).arg(&mv).arg(&mut out).arg(&vocab).arg(&h);
                let cfg = candle_core::cuda_backend::cudarc::driver::LaunchConfig {
                    grid_dim: (grid_dim(chunks.min(MAX_BLOCKS), what)?, 1, 1),
                    block_dim: (threads as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                if len > 0 {
                    // SAFETY: the arguments match embedding_grad_* in kernels/embedding.cu:
                    // meta holds vocab + 1 starts then positions below dy's rows.
                    unsafe { b.launch(cfg) }.w()?;
                }
                Ok((
                    CudaStorage::wrap_cuda_slice(out, dev.clone()),
                    Shape::from(len),
                ))
            })
        }
    }
}
