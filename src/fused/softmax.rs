//! The attention softmax: softmax(scores·scale + mask) over the last dim, fused with its backward,
//! beside the composed reference.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, D};

use super::{exp_shifted_in_place, for_rows, fused_on, row_max, slice_f32};

/// The reference: softmax from basic ops, with a detached max shift.
pub fn softmax_last_composed(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// softmax(x·scale + bias) over the last dim, with `x` `(B, …, T, S)` and `bias` `(B, T, S)`
/// broadcast over the middle dims: the attention probabilities in one pass. The bias (padding
/// and causal mask) is a constant: it gets no gradient.
struct ScaledMaskedSoftmax {
    scale: f32,
}

impl CustomOp2 for ScaledMaskedSoftmax {
    fn name(&self) -> &'static str {
        "acpo-attention-softmax"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = slice_f32(s1, l1, self.name())?;
        let bias = slice_f32(s2, l2, self.name())?;
        let (b, t, n) = l2.shape().dims3()?;
        let rows = x.len() / n.max(1);
        if l1.dims().first() != Some(&b) || l1.dims().last() != Some(&n) || rows % (b * t) != 0 {
            candle_core::bail!(
                "{}: scores {:?} do not match the bias {:?}",
                self.name(),
                l1.dims(),
                l2.dims()
            );
        }
        let per_b = rows / b;
        let mut y = vec![0f32; x.len()];
        for_rows(&mut y, n, |i, out| {
            let (bi, ti) = (i / per_b, i % t);
            let brow = &bias[(bi * t + ti) * n..(bi * t + ti + 1) * n];
            out.copy_from_slice(&x[i * n..(i + 1) * n]);
            scaled_masked_row(out, brow, self.scale);
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (b, t, n) = l2.shape().dims3()?;
        let rows = l1.shape().elem_count() / n.max(1);
        let fits = l1.dims().first() == Some(&b) && l1.dims().last() == Some(&n);
        if !fits || !rows.is_multiple_of(b * t) {
            candle_core::bail!(
                "{}: scores {:?} do not match the bias {:?}",
                self.name(),
                l1.dims(),
                l2.dims()
            );
        }
        cuda::attention_softmax(s1, l1, s2, l2, self.scale)
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _bias: &Tensor,
        y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dot = (dy * y)?.sum_keepdim(D::Minus1)?;
        Ok((
            Some(((dy.broadcast_sub(&dot)? * y)? * self.scale as f64)?),
            None,
        ))
    }
}

/// Attention probabilities softmax(scores·scale + bias): `scores` `(B, KV, rep, T, S)`, `bias`
/// `(B, 1, T, S)` (0 or −1e9). Fused on CPU f32 and CUDA.
pub fn attention_probs(scores: &Tensor, bias: &Tensor, scale: f64) -> Result<Tensor> {
    if fused_on(scores) && fused_on(bias) && scores.dtype() == bias.dtype() {
        let (b, _, t, s) = bias.dims4()?;
        let bias = bias.contiguous()?.reshape((b, t, s))?;
        return scores.contiguous()?.apply_op2(
            &bias,
            ScaledMaskedSoftmax {
                scale: scale as f32,
            },
        );
    }
    attention_probs_composed(scores, bias, scale)
}

/// The reference: scale, add the mask, softmax, from basic ops.
pub fn attention_probs_composed(scores: &Tensor, bias: &Tensor, scale: f64) -> Result<Tensor> {
    softmax_last_composed(&(scores * scale)?.broadcast_add(&bias.unsqueeze(2)?)?)
}

/// The CUDA launches of `kernels/softmax.cu` (the `cuda` feature); the CPU twin is this file's `cpu_fwd`.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};

    use crate::fused::launch::{dtype_of, kernel, ptx, rows_config, suffix, view, with_type};

    const PTX: (&str, &str) = ptx!("softmax");

    /// softmax(x·scale + bias) over rows of `n`, `bias` `(B, T, n)`.
    pub fn attention_softmax(
        x: &CudaStorage,
        lx: &Layout,
        bias: &CudaStorage,
        lb: &Layout,
        scale: f32,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-attention-softmax";
        let sfx = suffix(dtype_of(x), what)?;
        let (bsz, t, n) = lb.shape().dims3()?;
        with_type!(dtype_of(x), T, {
            let dev = &x.device;
            let (xv, bv) = (view::<T>(x, lx, what)?, view::<T>(bias, lb, what)?);
            let rows = xv.len() / n.max(1);
            let per_b = rows / bsz.max(1);
            let mut y = unsafe { dev.alloc::<T>(xv.len()) }?;
            let f = kernel!(dev, &format!("attention_softmax_{sfx}"), PTX)?;
            let (t_i, n_i) = (t as i32, n as i32);
            let mut b = f.builder();
            b.arg(&xv)
                .arg(&bv)
                .arg(&mut y)
                .arg(&t_i)
                .arg(&n_i)
                .arg(&per_b)
                .arg(&scale);
            if rows > 0 {
                unsafe { b.launch(rows_config(rows)?) }.w()?;
            }
            Ok((
                CudaStorage::wrap_cuda_slice(y, dev.clone()),
                lx.shape().clone(),
            ))
        })
    }
}

/// One row of [`attention_probs`] in place: `row = softmax(row · scale + mask)`. The decode
/// step's attention (`decode_attention.rs`) shares it, so both give the same bits.
pub(super) fn scaled_masked_row(row: &mut [f32], mask: &[f32], scale: f32) {
    for (o, &c) in row.iter_mut().zip(mask) {
        *o = *o * scale + c;
    }
    let m = row_max(row);
    let sum = exp_shifted_in_place(row, m);
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|o| *o *= inv);
}
