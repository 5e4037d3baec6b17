//! RMSNorm, x / sqrt(mean(x²) + ε) · w, fused with its backward for x and w, beside the
//! composed reference.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

use super::{for_rows, fused_on, slice_f32};

struct RmsNorm {
    eps: f32,
}

fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let ss: f32 = row.iter().map(|v| v * v).sum();
    1.0 / (ss / row.len() as f32 + eps).sqrt()
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "acpo-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = slice_f32(s1, l1, self.name())?;
        let w = slice_f32(s2, l2, self.name())?;
        let n = w.len();
        let mut y = vec![0f32; x.len()];
        for_rows(&mut y, n, |i, out| {
            let row = &x[i * n..(i + 1) * n];
            let r = inv_rms(row, self.eps);
            for ((o, &v), &g) in out.iter_mut().zip(row).zip(w) {
                *o = v * r * g;
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
        cuda::rms_norm_fwd(s1, l1, s2, l2, self.eps)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = fused_backward(x, w, dy, None, self.eps)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// RMSNorm's backward in one pass of [`RmsNormBwd`]: `(dx, dw)`, dx plus `residual` with one.
fn fused_backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    residual: Option<&Tensor>,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    if let Some(r) = residual {
        if r.shape() != x.shape() {
            let (rs, xs) = (r.shape(), x.shape());
            candle_core::bail!("rms_norm backward: a residual {rs:?} for x {xs:?}");
        }
    }
    let n = w.elem_count();
    let rows = x.elem_count() / n.max(1);
    let op = RmsNormBwd {
        eps,
        residual: residual.map(Tensor::contiguous).transpose()?,
    };
    // One pass computes dx (rows 0..rows) and dw (last row) together.
    let both = x
        .contiguous()?
        .apply_op3_no_bwd(&w.contiguous()?, &dy.contiguous()?, &op)?;
    let dx = both.narrow(0, 0, rows)?.reshape(x.shape())?;
    // dw in a buffer of its own: a view of the last row would keep all of dx alive as long as
    // the weight's gradient is kept, which the layer by hand adds straight into the step's
    // gradient sums (a whole layer's dx per norm, 4 norms a layer, held to the optimizer step).
    let dw = both
        .narrow(0, rows, 1)?
        .force_contiguous()?
        .reshape(w.shape())?;
    Ok((dx, dw))
}

/// Backward of RMSNorm: with r = 1/rms(x) and g = dy ⊙ w,
/// dx = r·g − x · r³ · mean(g ⊙ x), dw = Σ_rows dy ⊙ x · r. Output `(rows + 1, n)`.
struct RmsNormBwd {
    eps: f32,
    /// Added to dx in the same pass ([`rms_norm_backward_add`]): contiguous, x's shape and
    /// dtype, on x's device.
    residual: Option<Tensor>,
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "acpo-rms-norm-bwd"
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
        let x = slice_f32(s1, l1, self.name())?;
        let w = slice_f32(s2, l2, self.name())?;
        let dy = slice_f32(s3, l3, self.name())?;
        let n = w.len();
        let rows = x.len() / n.max(1);
        let held = self.residual.as_ref().map(|r| r.storage_and_layout());
        let res = match &held {
            Some((s, l)) => match &**s {
                candle_core::Storage::Cpu(c) => Some(slice_f32(c, l, self.name())?),
                _ => candle_core::bail!("{}: the residual on another device", self.name()),
            },
            None => None,
        };
        if res.is_some_and(|r| r.len() != x.len()) {
            candle_core::bail!("{}: a residual of another shape than x", self.name());
        }
        let mut out = vec![0f32; (rows + 1) * n];
        let (dx, dw) = out.split_at_mut(rows * n);
        // 1/rms per row, once: both dx and dw need it.
        let rs: Vec<f32> = x
            .chunks_exact(n.max(1))
            .map(|xr| inv_rms(xr, self.eps))
            .collect();
        for_rows(dx, n, |i, o| {
            let (xr, dyr) = (&x[i * n..(i + 1) * n], &dy[i * n..(i + 1) * n]);
            let r = rs[i];
            let gx: f32 = xr.iter().zip(dyr).zip(w).map(|((a, b), c)| a * b * c).sum();
            let c = r * r * r * gx / n as f32;
            for (j, oj) in o.iter_mut().enumerate() {
                let d = r * dyr[j] * w[j] - xr[j] * c;
                // the residual's add as candle's, rounded once more: the bits of `res + dx`
                *oj = match res {
                    Some(res) => res[i * n + j] + d,
                    None => d,
                };
            }
        });
        // dw accumulates over rows: serial over rows, vectorisable over the row.
        for (i, &r) in rs.iter().enumerate() {
            let (xr, dyr) = (&x[i * n..(i + 1) * n], &dy[i * n..(i + 1) * n]);
            for ((d, a), b) in dw.iter_mut().zip(xr).zip(dyr) {
                *d += a * b * r;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows + 1, n))))
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
        let held = self.residual.as_ref().map(|r| r.storage_and_layout());
        let res = match &held {
            Some((s, l)) => match &**s {
                candle_core::Storage::Cuda(c) => Some((c, *l)),
                _ => candle_core::bail!("{}: the residual on another device", self.name()),
            },
            None => None,
        };
        cuda::rms_norm_bwd((s1, l1), (s2, l2), (s3, l3), res, self.eps)
    }
}

/// RMSNorm over the last dim, `x / sqrt(mean(x²) + ε) · w`; fused on CPU f32 and CUDA.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if fused_on(x) && fused_on(w) && x.dtype() == w.dtype() {
        return x
            .contiguous()?
            .apply_op2(&w.contiguous()?, RmsNorm { eps: eps as f32 });
    }
    rms_norm_composed(x, w, eps)
}

/// RMSNorm's backward from its input `x`, weight `w` and output gradient `dy`: `(dx, dw)`, the
/// gradients [`rms_norm`]'s backward gives (one pass, fused on CPU f32 and CUDA) or, elsewhere,
/// those of [`rms_norm_composed`] from its formula (in f32):
/// `dx = r·(dy⊙w − n̂·mean(dy⊙w⊙n̂))`, `dw = Σ_rows dy ⊙ n̂`, with `r = 1/rms(x)`, `n̂ = x·r`.
/// For a backward written out by hand (`model/qwen/by_hand.rs`); `dw` sums every row.
pub fn rms_norm_backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    backward(x, w, dy, None, eps)
}

/// [`rms_norm_backward`] with `residual` added to dx in the same pass: `(residual + dx, dw)`,
/// the gradient of a residual stream `h` whose RMSNorm feeds a layer
/// (`dh = g + rms_bwd(h, w, dn)`, `model/qwen/by_hand.rs`), without writing dx and reading it
/// back. In f32 (the CPU twin and CUDA) the bits of `residual + dx`; on CUDA in bf16 rounded
/// once where the separate add rounds twice.
pub fn rms_norm_backward_add(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    residual: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    backward(x, w, dy, Some(residual), eps)
}

/// [`rms_norm_backward`], dx plus `residual` with one: the fused pass where it applies (CPU
/// f32, CUDA; every operand of x's dtype and device), else the formula and candle's add.
fn backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    residual: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let same = |t: &Tensor| t.dtype() == x.dtype() && t.device().same_device(x.device());
    if fused_on(x) && fused_on(w) && same(w) && same(dy) && residual.is_none_or(same) {
        return fused_backward(x, w, dy, residual, eps as f32);
    }
    let (dx, dw) = composed_backward(x, w, dy, eps)?;
    match residual {
        Some(r) => Ok(((r + dx)?, dw)),
        None => Ok((dx, dw)),
    }
}

/// [`rms_norm_backward`] from its formula in f32, where no kernel applies.
fn composed_backward(x: &Tensor, w: &Tensor, dy: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    let x32 = x.to_dtype(DType::F32)?;
    let r = (x32.sqr()?.mean_keepdim(D::Minus1)? + eps)?
        .sqrt()?
        .recip()?;
    let unit = x32.broadcast_mul(&r)?;
    let dy32 = dy.to_dtype(DType::F32)?;
    // the forward multiplied w by n̂ cast to the input's dtype
    let unit_cast = unit.to_dtype(x.dtype())?.to_dtype(DType::F32)?;
    let dw = (&dy32 * &unit_cast)?
        .reshape(((), w.elem_count()))?
        .sum(0)?
        .reshape(w.shape())?
        .to_dtype(w.dtype())?;
    let dn = dy32.broadcast_mul(&w.to_dtype(DType::F32)?)?;
    let mean = (&dn * &unit)?.mean_keepdim(D::Minus1)?;
    let dx = (dn - unit.broadcast_mul(&mean)?)?
        .broadcast_mul(&r)?
        .to_dtype(x.dtype())?;
    Ok((dx, dw))
}

/// The reference: RMSNorm from basic ops, in f32 like HF.
pub fn rms_norm_composed(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = x32.broadcast_div(&(var + eps)?.sqrt()?)?;
    normed.to_dtype(dtype)?.broadcast_mul(w)
}

/// The CUDA launches of `kernels/rms_norm.cu` (the `cuda` feature); the CPU twin is this file's `cpu_fwd`.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};

    use crate::fused::launch::{
        dtype_of, elems_config, grid_dim, kernel, ptx, rows_config, sizes, suffix, view, with_type,
        MAX_GRID_Y,
    };

    const PTX: (&str, &str) = ptx!("rms_norm");

    pub fn rms_norm_fwd(
        x: &CudaStorage,
        lx: &Layout,
        w: &CudaStorage,
        lw: &Layout,
        eps: f32,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-rms-norm";
        let sfx = suffix(dtype_of(x), what)?;
        with_type!(dtype_of(x), T, {
            let dev = &x.device;
            let (xv, wv) = (view::<T>(x, lx, what)?, view::<T>(w, lw, what)?);
            let n = wv.len();
            let rows = xv.len() / n.max(1);
            // SAFETY: every element is written by the kernel (each row's block covers the row).
            let mut y = unsafe { dev.alloc::<T>(xv.len()) }?;
            let f = kernel!(dev, &format!("rms_norm_fwd_{sfx}"), PTX)?;
            let n_i = n as i32;
            let mut b = f.builder();
            b.arg(&xv).arg(&wv).arg(&mut y).arg(&n_i).arg(&eps);
            // SAFETY: the arguments match the kernel's signature in kernels/rms_norm.cu.
            if rows > 0 {
                unsafe { b.launch(rows_config(rows)?) }.w()?;
            }
            Ok((
                CudaStorage::wrap_cuda_slice(y, dev.clone()),
                lx.shape().clone(),
            ))
        })
    }

    /// `[dx; dw]` as `(rows + 1, n)`, the CPU twin's layout; dx plus `res` with one.
    pub fn rms_norm_bwd(
        (x, lx): (&CudaStorage, &Layout),
        (w, lw): (&CudaStorage, &Layout),
        (dy, ldy): (&CudaStorage, &Layout),
        res: Option<(&CudaStorage, &Layout)>,
        eps: f32,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-rms-norm-bwd";
        let sfx = suffix(dtype_of(x), what)?;
        with_type!(dtype_of(x), T, {
            let dev = &x.device;
            let (xv, wv, dyv) = (
                view::<T>(x, lx, what)?,
                view::<T>(w, lw, what)?,
                view::<T>(dy, ldy, what)?,
            );
            let n = wv.len();
            let rows = xv.len() / n.max(1);
            // SAFETY: the dx kernel writes rows 0..rows, the dw kernel the last row.
            let mut out = unsafe { dev.alloc::<T>((rows + 1) * n) }?;
            let mut rs: CudaSlice<f32> = unsafe { dev.alloc::<f32>(rows.max(1)) }?;
            let n_i = n as i32;
            let resv = match res {
                Some((r, lr)) => Some(view::<T>(r, lr, what)?),
                None => None,
            };
            if resv.as_ref().is_some_and(|r| r.len() != xv.len()) {
                candle_core::bail!("{what}: a residual of another shape than x");
            }
            let name = match resv {
                Some(_) => format!("rms_norm_bwd_dx_res_{sfx}"),
                None => format!("rms_norm_bwd_dx_{sfx}"),
            };
            let f = kernel!(dev, &name, PTX)?;
            let mut b = f.builder();
            b.arg(&xv).arg(&wv).arg(&dyv);
            if let Some(r) = &resv {
                b.arg(r);
            }
            b.arg(&mut out).arg(&mut rs).arg(&n_i).arg(&eps);
            // SAFETY: the arguments match rms_norm_bwd_dx_* (x, w, dy, out, rs, n, eps) or
            // rms_norm_bwd_dx_res_* (the residual after dy) in kernels/rms_norm.cu.
            if rows > 0 {
                unsafe { b.launch(rows_config(rows)?) }.w()?;
            }
            dw_two_pass(dev, sfx, (&xv, &dyv, &rs), &mut out, rows, n)?;
            Ok((
                CudaStorage::wrap_cuda_slice(out, dev.clone()),
                Shape::from((rows + 1, n)),
            ))
        })
    }

    /// dw into the last row of `out`, in two passes (kernels/rms_norm.cu): partial sums over
    /// chunks of `RMS_DW_ROWS` rows for tiles of `RMS_DW_COLS` columns, written to a
    /// `(chunks, n)` f32 buffer, then each column's chunks in chunk order. No atomics: the same
    /// bits on every run.
    fn dw_two_pass<T: CudaDType + DeviceRepr>(
        dev: &CudaDevice,
        sfx: &str,
        (x, dy, rs): (&CudaView<T>, &CudaView<T>, &CudaSlice<f32>),
        out: &mut CudaSlice<T>,
        rows: usize,
        n: usize,
    ) -> Result<()> {
        let chunks = rows.div_ceil(sizes::RMS_DW_ROWS as usize);
        let tiles = n.div_ceil(sizes::RMS_DW_COLS as usize);
        if tiles == 0 {
            return Ok(());
        }
        if chunks > MAX_GRID_Y {
            candle_core::bail!(
                "acpo-rms-norm-bwd: {rows} rows are more than one launch takes ({MAX_GRID_Y} chunks of {})",
                sizes::RMS_DW_ROWS
            );
        }
        let (rows_i, n_i, chunks_i) = (rows as i32, n as i32, chunks as i32);
        // SAFETY: pass 1 writes every (chunk, column) partial before pass 2 reads it (with no
        // rows there is no chunk, and pass 2 writes zeros).
        let mut partial = unsafe { dev.alloc::<f32>((chunks * n).max(1)) }?;
        if chunks > 0 {
            let f = kernel!(dev, &format!("rms_norm_bwd_dw_partial_{sfx}"), PTX)?;
            let mut b = f.builder();
            b.arg(x)
                .arg(dy)
                .arg(rs)
                .arg(&mut partial)
                .arg(&rows_i)
                .arg(&n_i);
            let cfg = LaunchConfig {
                grid_dim: (grid_dim(tiles, "acpo-rms-norm-bwd")?, chunks as u32, 1),
                block_dim: (sizes::RMS_DW_COLS, sizes::RMS_DW_GROUPS, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match rms_norm_bwd_dw_partial_* in kernels/rms_norm.cu.
            unsafe { b.launch(cfg) }.w()?;
        }
        let f = kernel!(dev, &format!("rms_norm_bwd_dw_sum_{sfx}"), PTX)?;
        let mut b = f.builder();
        b.arg(&partial)
            .arg(out)
            .arg(&chunks_i)
            .arg(&rows_i)
            .arg(&n_i);
        // SAFETY: the arguments match rms_norm_bwd_dw_sum_* in kernels/rms_norm.cu.
        unsafe { b.launch(elems_config(n)) }.w()?;
        Ok(())
    }
}
