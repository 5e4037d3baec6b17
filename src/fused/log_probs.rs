//! Token log-probabilities, log softmax(z)[t] per row, fused with their backward
//! dz = g · (onehot(t) − softmax(z)).

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use super::{exp_shifted, for_rows, parallel, row_max, slice_f32};

/// log softmax(z)[t] per row; `z` `(N, V)` f32, `t` `(N)` u32.
struct TokenLogProbs;

fn log_sum_exp(row: &[f32]) -> f32 {
    let m = row_max(row);
    let s = exp_shifted(row, m, 1.0, &mut []);
    m + s.ln()
}

fn targets_u32<'a>(s: &'a CpuStorage, l: &Layout, v: usize, what: &str) -> Result<&'a [u32]> {
    let data = s.as_slice::<u32>()?;
    let t = match l.contiguous_offsets() {
        Some((a, b)) => &data[a..b],
        None => candle_core::bail!("{what}: targets must be contiguous"),
    };
    if let Some(bad) = t.iter().find(|&&t| t as usize >= v) {
        candle_core::bail!("{what}: target token {bad} outside the vocabulary of {v}");
    }
    Ok(t)
}

impl CustomOp2 for TokenLogProbs {
    fn name(&self) -> &'static str {
        "acpo-token-log-probs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let z = slice_f32(s1, l1, self.name())?;
        let v = l1.dims().last().copied().unwrap_or(1);
        let t = targets_u32(s2, l2, v, self.name())?;
        let row_lp = |(i, &ti): (usize, &u32)| {
            let row = &z[i * v..(i + 1) * v];
            row[ti as usize] - log_sum_exp(row)
        };
        let lp: Vec<f32> = if parallel(z.len()) {
            t.par_iter().enumerate().map(row_lp).collect()
        } else {
            t.iter().enumerate().map(row_lp).collect()
        };
        Ok((CpuStorage::F32(lp), Shape::from(t.len())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::token_log_probs(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        z: &Tensor,
        t: &Tensor,
        _lp: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dz = z.apply_op3_no_bwd(t, &g.contiguous()?, &TokenLogProbsBwd)?;
        Ok((Some(dz), None))
    }
}

/// dz = g · (onehot(t) − softmax(z)), the softmax recomputed row by row (never stored).
struct TokenLogProbsBwd;

impl CustomOp3 for TokenLogProbsBwd {
    fn name(&self) -> &'static str {
        "acpo-token-log-probs-bwd"
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
        let z = slice_f32(s1, l1, self.name())?;
        let v = l1.dims().last().copied().unwrap_or(1);
        let t = targets_u32(s2, l2, v, self.name())?;
        let g = slice_f32(s3, l3, self.name())?;
        let mut dz = vec![0f32; z.len()];
        for_rows(&mut dz, v, |i, o| {
            let row = &z[i * v..(i + 1) * v];
            let gi = g[i];
            if gi == 0.0 {
                return;
            }
            let lse = log_sum_exp(row);
            exp_shifted(row, lse, -gi, o);
            o[t[i] as usize] += gi;
        });
        Ok((CpuStorage::F32(dz), l1.shape().clone()))
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
        cuda::token_log_probs_bwd(s1, l1, s2, l2, s3, l3)
    }
}

/// `log softmax(z)[t]` over the last dim: `z` `(..., V)` f32, `t` `(...)` u32 → `(...)`.
/// Callers check [`super::fused_on_f32`] first; the composed reference lives in `algo::token`. Target
/// tokens are checked against the vocabulary on the CPU only (a kernel cannot report them).
pub fn token_log_probs(z: &Tensor, t: &Tensor) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let v = z.dim(D::Minus1)?;
    // A row of logits a target, on every device (the CPU's twin and the kernel index by it).
    if z.elem_count() != t.elem_count() * v {
        candle_core::bail!(
            "token log-probs: logits {:?} for targets {dims:?}: not one row of the vocabulary a target",
            z.dims()
        );
    }
    let z2 = z.contiguous()?.reshape(((), v))?;
    let t1 = t.to_dtype(DType::U32)?.contiguous()?.flatten_all()?;
    z2.apply_op2(&t1, TokenLogProbs)?.reshape(dims)
}

/// The CUDA launches of `kernels/log_probs.cu` (the `cuda` feature); the CPU twin is this file's `cpu_fwd`.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, Layout, Result, Shape};

    use crate::fused::launch::{kernel, ptx, rows_config, view};

    const PTX: (&str, &str) = ptx!("log_probs");

    /// The vocabulary as the kernels' `int`, after checking that the logits hold a row of it
    /// for each of `rows` targets (and `grads` a value each, where given): a block reads its
    /// row's `v` logits wherever the target says, so a mismatch would read past them.
    fn checked_v(
        what: &str,
        logits: usize,
        v: usize,
        rows: usize,
        grads: Option<usize>,
    ) -> Result<i32> {
        if logits != rows * v || grads.is_some_and(|g| g != rows) {
            candle_core::bail!(
                "{what}: {logits} logits, {rows} targets of a vocabulary of {v}{}",
                grads.map_or(String::new(), |g| format!(", {g} gradients"))
            );
        }
        i32::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("{what}: a vocabulary of {v}")))
    }

    pub fn token_log_probs(
        z: &CudaStorage,
        lz: &Layout,
        t: &CudaStorage,
        lt: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-token-log-probs";
        let dev = &z.device;
        let (zv, tv) = (view::<f32>(z, lz, what)?, view::<u32>(t, lt, what)?);
        let v = lz.dims().last().copied().unwrap_or(1);
        let rows = tv.len();
        let v_i = checked_v(what, zv.len(), v, rows, None)?;
        // SAFETY: every row's block writes its value.
        let mut lp = unsafe { dev.alloc::<f32>(rows) }?;
        let f = kernel!(dev, "token_log_probs_f32", PTX)?;
        let mut b = f.builder();
        b.arg(&zv).arg(&tv).arg(&mut lp).arg(&v_i);
        if rows > 0 {
            unsafe { b.launch(rows_config(rows)?) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(lp, dev.clone()),
            Shape::from(rows),
        ))
    }

    pub fn token_log_probs_bwd(
        z: &CudaStorage,
        lz: &Layout,
        t: &CudaStorage,
        lt: &Layout,
        g: &CudaStorage,
        lg: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-token-log-probs-bwd";
        let dev = &z.device;
        let (zv, tv, gv) = (
            view::<f32>(z, lz, what)?,
            view::<u32>(t, lt, what)?,
            view::<f32>(g, lg, what)?,
        );
        let v = lz.dims().last().copied().unwrap_or(1);
        let rows = tv.len();
        let v_i = checked_v(what, zv.len(), v, rows, Some(gv.len()))?;
        // SAFETY: every row's block writes its row of the gradient.
        let mut dz = unsafe { dev.alloc::<f32>(zv.len()) }?;
        let f = kernel!(dev, "token_log_probs_bwd_f32", PTX)?;
        let mut b = f.builder();
        b.arg(&zv).arg(&tv).arg(&gv).arg(&mut dz).arg(&v_i);
        if rows > 0 {
            unsafe { b.launch(rows_config(rows)?) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(dz, dev.clone()),
            lz.shape().clone(),
        ))
    }
}
