//! One vocabulary chunk's element-wise chain as one op each way, for [`super::vocab_log_probs`]
//! on CUDA (`kernels/vocab_chunk.cu`): the chunk of logits `z = h·W_cᵀ / τ` `(N, C)`, straight
//! from the matmul in its dtype, is read once
//! - forward ([`chunk_stats`]): into each row's running statistics `(m, s, u, z_t)` `(N, 4)` f32
//!   (the module docs of `vocab.rs` give the algebra);
//! - backward ([`chunk_grad`]): into `dz = ((onehot(t) − p)·g_lp − p·(z − E[z])·g_H) / τ`, in z's
//!   dtype, from the rows' `(lse, E[z], g_lp, g_H)` `(N, 4)` f32.
//!
//! Composed from candle ops (vocab.rs, the CPU path and the reference) each is about a dozen
//! passes over the chunk. The `cpu_fwd`s here are the kernels' CPU twins (f32), the same
//! operations row by row.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::{for_rows, slice_f32};

/// The running statistics after one more chunk: `z` `(N, C)`, the targets `(N)` u32 and the
/// statistics so far `(N, 4)` (ignored for the first chunk) in, `(N, 4)` f32 out.
struct ChunkStats {
    c0: usize,
    temperature: f32,
    first: bool,
}

/// dz of one chunk: `z` `(N, C)`, the targets `(N)` u32 and `(lse, E[z], g_lp, g_H)` `(N, 4)` in,
/// `(N, C)` in z's dtype out.
struct ChunkGrad {
    c0: usize,
    temperature: f32,
}

fn targets_of<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [u32]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<u32>()?[a..b]),
        None => candle_core::bail!("{what}: targets must be contiguous"),
    }
}

/// `(rows, cols)` of a chunk `z` and a check of the other inputs' shapes.
fn chunk_dims(what: &str, z: &Layout, t: &Layout, rowv: &Layout) -> Result<(usize, usize)> {
    let (rows, cols) = z.shape().dims2()?;
    if t.shape().elem_count() != rows || rowv.dims() != [rows, 4] {
        candle_core::bail!(
            "{what}: chunk {:?}, targets {:?}, row values {:?}",
            z.dims(),
            t.dims(),
            rowv.dims()
        );
    }
    Ok((rows, cols))
}

impl CustomOp3 for ChunkStats {
    fn name(&self) -> &'static str {
        "acpo-vocab-chunk-stats"
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
        let (rows, cols) = chunk_dims(self.name(), l1, l2, l3)?;
        let z = slice_f32(s1, l1, self.name())?;
        let t = targets_of(s2, l2, self.name())?;
        let prev = slice_f32(s3, l3, self.name())?;
        let tau = self.temperature;
        let mut out = vec![0f32; rows * 4];
        for_rows(&mut out, 4, |i, o| {
            let zr = &z[i * cols..(i + 1) * cols];
            let cm = zr.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x / tau));
            let m_old = if self.first { cm } else { prev[i * 4] };
            let m = m_old.max(cm);
            let (mut se, mut sed) = (0f32, 0f32);
            for &x in zr {
                let d = x / tau - m;
                let e = d.exp();
                se += e;
                sed += e * d;
            }
            let ti = (t[i] as usize).wrapping_sub(self.c0);
            let zt = if ti < cols { zr[ti] / tau } else { 0.0 };
            o[0] = m;
            if self.first {
                (o[1], o[2], o[3]) = (se, sed, zt);
            } else {
                let (s, u) = (prev[i * 4 + 1], prev[i * 4 + 2]);
                let diff = m_old - m;
                let alpha = diff.exp();
                o[1] = alpha * s + se;
                o[2] = alpha * (u + s * diff) + sed;
                o[3] = prev[i * 4 + 3] + zt;
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((rows, 4))))
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
        let (rows, cols) = chunk_dims(self.name(), l1, l2, l3)?;
        let args = cuda::Chunk {
            rows,
            cols,
            c0: self.c0,
            temperature: self.temperature,
        };
        let out = cuda::stats((s1, l1), (s2, l2), (s3, l3), &args, self.first)?;
        Ok((out, Shape::from((rows, 4))))
    }
}

impl CustomOp3 for ChunkGrad {
    fn name(&self) -> &'static str {
        "acpo-vocab-chunk-grad"
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
        let (_, cols) = chunk_dims(self.name(), l1, l2, l3)?;
        let z = slice_f32(s1, l1, self.name())?;
        let t = targets_of(s2, l2, self.name())?;
        let rowv = slice_f32(s3, l3, self.name())?;
        let tau = self.temperature;
        let mut dz = vec![0f32; z.len()];
        for_rows(&mut dz, cols, |i, o| {
            let [lse, mean_z, g_lp, g_ent] = [0, 1, 2, 3].map(|k| rowv[i * 4 + k]);
            let ti = (t[i] as usize).wrapping_sub(self.c0);
            for (j, (oj, &x)) in o.iter_mut().zip(&z[i * cols..(i + 1) * cols]).enumerate() {
                let zz = x / tau;
                let p = (zz - lse).exp();
                let d_lp = (if j == ti { 1.0 } else { 0.0 } - p) * g_lp;
                let d_ent = p * (zz - mean_z) * g_ent;
                *oj = (d_lp - d_ent) / tau;
            }
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
        let (rows, cols) = chunk_dims(self.name(), l1, l2, l3)?;
        let args = cuda::Chunk {
            rows,
            cols,
            c0: self.c0,
            temperature: self.temperature,
        };
        let dz = cuda::grad((s1, l1), (s2, l2), (s3, l3), &args)?;
        Ok((dz, l1.shape().clone()))
    }
}

/// The rows' statistics `(m, s, u, z_t)` `(N, 4)` f32 after the chunk `z` `(N, C)` of the
/// vocabulary's columns `c0..c0 + C` (`prev`: the statistics before it; None for the first).
pub(super) fn chunk_stats(
    z: &Tensor,
    targets: &Tensor,
    prev: Option<&Tensor>,
    c0: usize,
    temperature: f64,
) -> Result<Tensor> {
    let op = ChunkStats {
        c0,
        temperature: temperature as f32,
        first: prev.is_none(),
    };
    let zeros;
    let prev = match prev {
        Some(p) => p,
        None => {
            zeros = Tensor::zeros((z.dim(0)?, 4), DType::F32, z.device())?;
            &zeros
        }
    };
    z.contiguous()?
        .apply_op3_no_bwd(targets, &prev.contiguous()?, &op)
}

/// dz `(N, C)` of the chunk `z` `(N, C)` of columns `c0..c0 + C`, in z's dtype, from the rows'
/// `(lse, E[z], g_lp, g_H)` `(N, 4)` f32.
pub(super) fn chunk_grad(
    z: &Tensor,
    targets: &Tensor,
    rowv: &Tensor,
    c0: usize,
    temperature: f64,
) -> Result<Tensor> {
    let op = ChunkGrad {
        c0,
        temperature: temperature as f32,
    };
    z.contiguous()?
        .apply_op3_no_bwd(targets, &rowv.contiguous()?, &op)
}

/// The CUDA launches of `kernels/vocab_chunk.cu` (the `cuda` feature); the CPU twins are this
/// file's `cpu_fwd`s.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, DType, Layout, Result};

    use crate::fused::launch::{dtype_of, kernel, ptx, rows_config, suffix, view, with_type};

    const PTX: (&str, &str) = ptx!("vocab_chunk");

    type Arg<'a> = (&'a CudaStorage, &'a Layout);

    /// A chunk's shape, its first column and the temperature.
    pub struct Chunk {
        pub rows: usize,
        pub cols: usize,
        pub c0: usize,
        pub temperature: f32,
    }

    impl Chunk {
        fn ints(&self, what: &str) -> Result<(i32, i32)> {
            let fit = |n: usize| {
                i32::try_from(n)
                    .map_err(|_| candle_core::Error::Msg(format!("{what}: {n} columns")))
            };
            Ok((fit(self.c0)?, fit(self.cols)?))
        }
    }

    pub fn stats(z: Arg, t: Arg, prev: Arg, c: &Chunk, first: bool) -> Result<CudaStorage> {
        let what = "acpo-vocab-chunk-stats";
        let sfx = suffix(dtype_of(z.0), what)?;
        let (c0, cols) = c.ints(what)?;
        let first = i32::from(first);
        with_type!(dtype_of(z.0), T, {
            let dev = &z.0.device;
            let zv = view::<T>(z.0, z.1, what)?;
            let tv = view::<u32>(t.0, t.1, what)?;
            let pv = view::<f32>(prev.0, prev.1, what)?;
            // SAFETY: every row's block writes its four statistics.
            let mut out = unsafe { dev.alloc::<f32>(c.rows * 4) }?;
            let f = kernel!(dev, &format!("vocab_stats_{sfx}"), PTX)?;
            let mut b = f.builder();
            b.arg(&zv)
                .arg(&tv)
                .arg(&pv)
                .arg(&mut out)
                .arg(&c0)
                .arg(&cols)
                .arg(&c.temperature)
                .arg(&first);
            if c.rows > 0 {
                // SAFETY: the arguments match vocab_stats_* in kernels/vocab_chunk.cu.
                unsafe { b.launch(rows_config(c.rows)?) }.w()?;
            }
            Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
        })
    }

    pub fn grad(z: Arg, t: Arg, rowv: Arg, c: &Chunk) -> Result<CudaStorage> {
        let what = "acpo-vocab-chunk-grad";
        let sfx = suffix(dtype_of(z.0), what)?;
        let (c0, cols) = c.ints(what)?;
        with_type!(dtype_of(z.0), T, {
            let dev = &z.0.device;
            let zv = view::<T>(z.0, z.1, what)?;
            let tv = view::<u32>(t.0, t.1, what)?;
            let rv = view::<f32>(rowv.0, rowv.1, what)?;
            // SAFETY: every row's block writes its row of dz.
            let mut dz = unsafe { dev.alloc::<T>(zv.len()) }?;
            let f = kernel!(dev, &format!("vocab_grad_{sfx}"), PTX)?;
            let mut b = f.builder();
            b.arg(&zv)
                .arg(&tv)
                .arg(&rv)
                .arg(&mut dz)
                .arg(&c0)
                .arg(&cols)
                .arg(&c.temperature);
            if c.rows > 0 {
                // SAFETY: the arguments match vocab_grad_* in kernels/vocab_chunk.cu.
                unsafe { b.launch(rows_config(c.rows)?) }.w()?;
            }
            Ok(CudaStorage::wrap_cuda_slice(dz, dev.clone()))
        })
    }
}
