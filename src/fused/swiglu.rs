//! SwiGLU, silu(gate) ⊙ up, fused with its backward for both inputs, beside the composed
//! reference.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::{for_rows, fused_on, parallel, slice_f32};

/// `out[i] = sigmoid(x[i]) = 1 / (1 + exp(−x[i]))`, the exponentials eight at a time
/// ([`super::exp_in_place`], `f32::exp`'s bits).
fn sigmoids(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = -v;
    }
    super::exp_in_place(out);
    for o in out.iter_mut() {
        *o = 1.0 / (1.0 + *o);
    }
}

/// silu(g) ⊙ u, the MLP's gate: one pass instead of silu, then a product.
struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "acpo-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = slice_f32(s1, l1, self.name())?;
        let u = slice_f32(s2, l2, self.name())?;
        if l1.dims() != l2.dims() {
            candle_core::bail!("{}: gate {:?}, up {:?}", self.name(), l1.dims(), l2.dims());
        }
        let n = l1.dims().last().copied().unwrap_or(1);
        let mut y = vec![0f32; g.len()];
        for_rows(&mut y, n, |i, out| {
            let (gr, ur) = (&g[i * n..(i + 1) * n], &u[i * n..(i + 1) * n]);
            sigmoids(gr, out);
            for ((o, &a), &b) in out.iter_mut().zip(gr).zip(ur) {
                *o = a * *o * b;
            }
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
        cuda::swiglu_fwd(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let both = g.apply_op3_no_bwd(u, &dy.contiguous()?, &SwiGluBwd)?;
        let dg = both.get(0)?.reshape(g.shape())?;
        let du = both.get(1)?.reshape(u.shape())?;
        Ok((Some(dg), Some(du)))
    }
}

/// With σ = sigmoid(g): dg = dy·u·σ·(1 + g·(1 − σ)), du = dy·g·σ. Output `(2, N)`.
struct SwiGluBwd;

impl CustomOp3 for SwiGluBwd {
    fn name(&self) -> &'static str {
        "acpo-swiglu-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = slice_f32(s1, l1, self.name())?;
        let u = slice_f32(s2, l2, self.name())?;
        let dy = slice_f32(s3, l3, self.name())?;
        let len = g.len();
        let n = l1.dims().last().copied().unwrap_or(1);
        let mut out = vec![0f32; 2 * len];
        let (dg, du) = out.split_at_mut(len);
        let work = |i: usize, dgr: &mut [f32], dur: &mut [f32]| {
            sigmoids(&g[i * n..i * n + dgr.len()], dgr); // σ, read before dg is written
            for j in 0..dgr.len() {
                let k = i * n + j;
                let sg = dgr[j];
                dgr[j] = dy[k] * u[k] * sg * (1.0 + g[k] * (1.0 - sg));
                dur[j] = dy[k] * g[k] * sg;
            }
        };
        if parallel(len) {
            dg.par_chunks_mut(n)
                .zip(du.par_chunks_mut(n))
                .enumerate()
                .for_each(|(i, (a, b))| work(i, a, b));
        } else {
            for (i, (a, b)) in dg.chunks_mut(n).zip(du.chunks_mut(n)).enumerate() {
                work(i, a, b);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((2, len))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::swiglu_bwd(s1, l1, s2, l2, s3, l3)
    }
}

/// silu(gate) ⊙ up; fused on CPU f32 and CUDA.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if fused_on(gate) && fused_on(up) && gate.dtype() == up.dtype() {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu);
    }
    swiglu_composed(gate, up)
}

/// SwiGLU's backward from its inputs and output gradient `dy`: `(dgate, dup)`, the gradients
/// [`swiglu`]'s backward gives (both in one pass, fused on CPU f32 and CUDA) or, elsewhere, from
/// the formula in f32: with σ = sigmoid(g), `dg = dy·u·σ·(1 + g·(1 − σ))`, `du = dy·g·σ`. For a
/// backward written out by hand (`model/qwen/by_hand.rs`).
pub fn swiglu_backward(gate: &Tensor, up: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    if fused_on(gate) && fused_on(up) && gate.dtype() == up.dtype() && dy.dtype() == gate.dtype() {
        let (dg, du) = SwiGlu.bwd(&gate.contiguous()?, &up.contiguous()?, dy, dy)?;
        let missing = || candle_core::Error::Msg("swiglu backward: no gradient".into());
        return Ok((dg.ok_or_else(missing)?, du.ok_or_else(missing)?));
    }
    let g = gate.to_dtype(DType::F32)?;
    let u = up.to_dtype(DType::F32)?;
    let dy = dy.to_dtype(DType::F32)?;
    let sig = (g.neg()?.exp()? + 1.0)?.recip()?;
    let dsilu = (&sig * ((&g * sig.affine(-1.0, 1.0)?)? + 1.0)?)?;
    let dg = ((&dy * &u)? * dsilu)?.to_dtype(gate.dtype())?;
    let du = ((&dy * &g)? * &sig)?.to_dtype(up.dtype())?;
    Ok((dg, du))
}

/// The reference: candle's silu, then the product.
pub fn swiglu_composed(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

/// The CUDA launches of `kernels/swiglu.cu` (the `cuda` feature); the CPU twin is this file's `cpu_fwd`.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};

    use crate::fused::launch::{dtype_of, elems_config, kernel, ptx, suffix, view, with_type};

    const PTX: (&str, &str) = ptx!("swiglu");

    pub fn swiglu_fwd(
        g: &CudaStorage,
        lg: &Layout,
        u: &CudaStorage,
        lu: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-swiglu";
        let sfx = suffix(dtype_of(g), what)?;
        with_type!(dtype_of(g), T, {
            let dev = &g.device;
            let (gv, uv) = (view::<T>(g, lg, what)?, view::<T>(u, lu, what)?);
            let len = gv.len();
            let mut y = unsafe { dev.alloc::<T>(len) }?;
            let f = kernel!(dev, &format!("swiglu_fwd_{sfx}"), PTX)?;
            let mut b = f.builder();
            b.arg(&gv).arg(&uv).arg(&mut y).arg(&len);
            unsafe { b.launch(elems_config(len)) }.w()?;
            Ok((
                CudaStorage::wrap_cuda_slice(y, dev.clone()),
                lg.shape().clone(),
            ))
        })
    }

    /// `[dg; du]` as `(2, N)`.
    pub fn swiglu_bwd(
        g: &CudaStorage,
        lg: &Layout,
        u: &CudaStorage,
        lu: &Layout,
        dy: &CudaStorage,
        ldy: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-swiglu-bwd";
        let sfx = suffix(dtype_of(g), what)?;
        with_type!(dtype_of(g), T, {
            let dev = &g.device;
            let (gv, uv, dyv) = (
                view::<T>(g, lg, what)?,
                view::<T>(u, lu, what)?,
                view::<T>(dy, ldy, what)?,
            );
            let len = gv.len();
            let mut out = unsafe { dev.alloc::<T>(2 * len) }?;
            let f = kernel!(dev, &format!("swiglu_bwd_{sfx}"), PTX)?;
            let mut b = f.builder();
            b.arg(&gv).arg(&uv).arg(&dyv).arg(&mut out).arg(&len);
            unsafe { b.launch(elems_config(len)) }.w()?;
            Ok((
                CudaStorage::wrap_cuda_slice(out, dev.clone()),
                Shape::from((2, len)),
            ))
        })
    }
}
