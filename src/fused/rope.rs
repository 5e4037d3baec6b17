//! The rotary position embedding, fused with its backward (the inverse rotation), beside the
//! composed reference.

use super::*;

/// x·cos + rotate_half(x)·sin over `x` `(B, H, T, D)` with `cos`, `sin` `(B, 1, T, D)` whose two
/// halves are equal (HF's `cat(freqs, freqs)`): per pair (x₁, x₂) of the two halves,
/// (x₁c − x₂s, x₂c + x₁s). The backward is the inverse rotation: the same op with −sin.
struct Rope;

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "acpo-rope"
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
        let cos = slice_f32(s2, l2, self.name())?;
        let sin = slice_f32(s3, l3, self.name())?;
        let (b, h, t, d) = l1.shape().dims4()?;
        if l2.dims() != [b, 1, t, d] || l3.dims() != l2.dims() || d % 2 != 0 {
            candle_core::bail!(
                "{}: x {:?}, cos {:?}, sin {:?}",
                self.name(),
                l1.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        let half = d / 2;
        let mut y = vec![0f32; x.len()];
        for_rows(&mut y, d, |i, out| {
            let (bi, ti) = (i / (h * t), i % t);
            let xr = &x[i * d..(i + 1) * d];
            let c = &cos[(bi * t + ti) * d..(bi * t + ti) * d + half];
            let s = &sin[(bi * t + ti) * d..(bi * t + ti) * d + half];
            let (o1, o2) = out.split_at_mut(half);
            let (x1, x2) = xr.split_at(half);
            for j in 0..half {
                o1[j] = x1[j] * c[j] - x2[j] * s[j];
                o2[j] = x2[j] * c[j] + x1[j] * s[j];
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
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (b, _, t, d) = l1.shape().dims4()?;
        if l2.dims() != [b, 1, t, d] || l3.dims() != l2.dims() || d % 2 != 0 {
            candle_core::bail!(
                "{}: x {:?}, cos {:?}, sin {:?}",
                self.name(),
                l1.dims(),
                l2.dims(),
                l3.dims()
            );
        }
        cuda::rope(s1, l1, s2, l2, s3, l3)
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = dy.contiguous()?.apply_op3_no_bwd(cos, &sin.neg()?, &Rope)?;
        Ok((Some(dx), None, None))
    }
}

/// Rotary embedding of `x` `(B, H, T, D)` by `cos`, `sin` `(B, 1, T, D)` (positions' tables, no
/// gradient); fused on CPU f32 and CUDA.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let same = x.dtype() == cos.dtype() && x.dtype() == sin.dtype();
    if same && fused_on(x) && fused_on(cos) && fused_on(sin) {
        return x
            .contiguous()?
            .apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope);
    }
    rope_composed(x, cos, sin)
}

/// The reference: x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁], basic ops.
pub fn rope_composed(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// The CUDA launches of `kernels/rope.cu` (the `cuda` feature); the CPU twin is this file's `cpu_fwd`.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};

    use crate::fused::launch::{dtype_of, elems_config, kernel, ptx, suffix, view, with_type};

    const PTX: (&str, &str) = ptx!("rope");

    /// The rotation of `x` `(B, H, T, D)` by `cos`, `sign · sin` `(B, 1, T, D)`.
    pub fn rope(
        x: &CudaStorage,
        lx: &Layout,
        cos: &CudaStorage,
        lc: &Layout,
        sin: &CudaStorage,
        ls: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-rope";
        let sfx = suffix(dtype_of(x), what)?;
        let (_, h, t, d) = lx.shape().dims4()?;
        with_type!(dtype_of(x), T, {
            let dev = &x.device;
            let (xv, cv, sv) = (
                view::<T>(x, lx, what)?,
                view::<T>(cos, lc, what)?,
                view::<T>(sin, ls, what)?,
            );
            let pairs = xv.len() / 2;
            let mut y = unsafe { dev.alloc::<T>(xv.len()) }?;
            let f = kernel!(dev, &format!("rope_{sfx}"), PTX)?;
            let (h_i, t_i, d_i, sign) = (h as i32, t as i32, d as i32, 1.0f32);
            let mut b = f.builder();
            b.arg(&xv)
                .arg(&cv)
                .arg(&sv)
                .arg(&mut y)
                .arg(&h_i)
                .arg(&t_i)
                .arg(&d_i)
                .arg(&sign)
                .arg(&pairs);
            unsafe { b.launch(elems_config(pairs)) }.w()?;
            Ok((
                CudaStorage::wrap_cuda_slice(y, dev.clone()),
                lx.shape().clone(),
            ))
        })
    }
}
