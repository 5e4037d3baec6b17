//! The seed of a backward that starts from a known output gradient: [`backward_seed`]`(y, g)`
//! is the scalar ⟨y, g⟩ whose backward hands `g` straight to `y`.
//!
//! candle starts a backward only from a scalar (its gradient 1), so a backward from a given
//! `g` (a checkpointed layer's, one layer's attention in `acpo bench attention`) used to
//! differentiate `(y ⊙ g).sum_all()`. That costs, besides the product, a sum of every element
//! in one block (candle 0.11's CUDA reduction gives a full reduction one block: ~8e9 elements/s,
//! 4.7 ms for one layer's output at 2 × 9,220 tokens, 39 ms for the tied lm_head's 311 M
//! elements), and a backward through the sum and the product: a ones tensor of y's shape, the
//! product's gradient for `g` too (nobody reads it), and their zero fills. Here the scalar is
//! computed in two stages (each row of the last dimension, then the rows: one block per row on
//! CUDA) from detached inputs, and the op's backward is `g · grad_out`. At the root of a backward
//! `grad_out` is 1, so `y` receives `0 + 1·g`, exactly what the old sum gave it (candle adds every
//! gradient into a zero-filled one): the same bits, on every device.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Storage, Tensor, D};

/// The op whose forward returns ⟨y, g⟩, computed before it, and whose backward is `g · grad_out`
/// for `y` (none for `g`, a constant).
struct Seed {
    value: Tensor,
}

impl Seed {
    fn contiguous(&self) -> Result<()> {
        if !self.value.is_contiguous() {
            candle_core::bail!("{}: the value must be contiguous", self.name());
        }
        Ok(())
    }
}

impl CustomOp2 for Seed {
    fn name(&self) -> &'static str {
        "acpo-backward-seed"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.contiguous()?;
        let (st, l) = self.value.storage_and_layout();
        match &*st {
            Storage::Cpu(s) => Ok((s.try_clone(l)?, l.shape().clone())),
            _ => candle_core::bail!("{}: the value on another device", self.name()),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.contiguous()?;
        let (st, l) = self.value.storage_and_layout();
        match &*st {
            Storage::Cuda(s) => Ok((s.try_clone(l)?, l.shape().clone())),
            _ => candle_core::bail!("{}: the value on another device", self.name()),
        }
    }

    fn bwd(
        &self,
        _y: &Tensor,
        g: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(g.broadcast_mul(grad)?), None))
    }
}

/// The scalar ⟨y, g⟩ (y's dtype) whose backward gives `y` the gradient `g · grad_out`: `seed(y,
/// g).backward()` backpropagates `g` from `y` with no single-block reduction and gives the
/// gradients of `(y * g).sum_all().backward()` bit for bit. `g` is a constant (detached; it gets
/// no gradient). `y` and `g` must have the same shape and dtype.
pub fn backward_seed(y: &Tensor, g: &Tensor) -> Result<Tensor> {
    if y.dims() != g.dims() || y.dtype() != g.dtype() {
        candle_core::bail!(
            "backward seed: y {:?} {:?} and its gradient {:?} {:?} differ",
            y.dims(),
            y.dtype(),
            g.dims(),
            g.dtype()
        );
    }
    let g = g.detach();
    let product = (y.detach() * &g)?;
    // Rows of the last dimension first (one block each on CUDA), then the rows.
    let value = match product.rank() {
        0 => product,
        _ => product.sum(D::Minus1)?.flatten_all()?.sum(0)?,
    }
    .contiguous()?;
    y.apply_op2(&g, Seed { value })
}
