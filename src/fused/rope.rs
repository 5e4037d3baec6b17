//! The rotary position embedding, fused with its backward (the inverse rotation), beside the
//! composed reference. It reads and writes either of two layouts: heads first `(B, H, T, D)`,
//! which attention takes, or tokens first `(B, T, H, D)`, which the q/k projections make. The
//! model rotates q and k from tokens first to heads first in one pass ([`rope_heads`]), so no
//! transpose is made contiguous before (a copy of q and of k per layer, forward and backward).

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};

use super::{for_rows, fused_on, slice_f32};

/// The order of a `(B, ·, ·, D)` tensor's middle dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// `(B, H, T, D)`.
    HeadsFirst,
    /// `(B, T, H, D)`.
    TokensFirst,
}

impl Order {
    /// `(b, h, t)` of `dims` (4-D) in this order.
    fn bht(self, dims: &[usize]) -> (usize, usize, usize) {
        match self {
            Order::HeadsFirst => (dims[0], dims[1], dims[2]),
            Order::TokensFirst => (dims[0], dims[2], dims[1]),
        }
    }

    /// The row index of (b, h, t) among `(B, ·, ·)` rows of this order.
    fn row(self, (b, h, t): (usize, usize, usize), (nh, nt): (usize, usize)) -> usize {
        match self {
            Order::HeadsFirst => (b * nh + h) * nt + t,
            Order::TokensFirst => (b * nt + t) * nh + h,
        }
    }

    /// The shape `(B, ·, ·, D)` of this order.
    fn shape(self, (b, h, t): (usize, usize, usize), d: usize) -> Shape {
        match self {
            Order::HeadsFirst => Shape::from((b, h, t, d)),
            Order::TokensFirst => Shape::from((b, t, h, d)),
        }
    }
}

/// x·cos + rotate_half(x)·sin with `cos`, `sin` `(B, 1, T, D)` whose two halves are equal (HF's
/// `cat(freqs, freqs)`): per pair (x₁, x₂) of the two halves, (x₁c − x₂s, x₂c + x₁s); `x` in
/// order `from`, the result in order `to`. The backward is the inverse rotation, the same op
/// with −sin, from `to` back to `from`.
struct Rope {
    from: Order,
    to: Order,
}

impl Rope {
    /// `(b, h, t, d)` of x, after checking that cos and sin fit it.
    fn dims(&self, x: &Layout, cos: &Layout, sin: &Layout) -> Result<(usize, usize, usize, usize)> {
        let dims = x.dims();
        if dims.len() != 4 {
            candle_core::bail!("{}: x {dims:?} is not 4-D", self.name());
        }
        let (b, h, t) = self.from.bht(dims);
        let d = dims[3];
        if cos.dims() != [b, 1, t, d] || sin.dims() != cos.dims() || !d.is_multiple_of(2) {
            candle_core::bail!(
                "{}: x {dims:?}, cos {:?}, sin {:?}",
                self.name(),
                cos.dims(),
                sin.dims()
            );
        }
        Ok((b, h, t, d))
    }
}

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
        let (b, h, t, d) = self.dims(l1, l2, l3)?;
        let half = d / 2;
        let mut y = vec![0f32; x.len()];
        // Rows in the output's order; each reads its row of x wherever `from` keeps it.
        for_rows(&mut y, d, |i, out| {
            let bi = i / (h * t);
            let (hi, ti) = match self.to {
                Order::HeadsFirst => ((i / t) % h, i % t),
                Order::TokensFirst => (i % h, (i / h) % t),
            };
            let xi = self.from.row((bi, hi, ti), (h, t));
            let xr = &x[xi * d..(xi + 1) * d];
            let c = &cos[(bi * t + ti) * d..(bi * t + ti) * d + half];
            let s = &sin[(bi * t + ti) * d..(bi * t + ti) * d + half];
            let (o1, o2) = out.split_at_mut(half);
            let (x1, x2) = xr.split_at(half);
            for j in 0..half {
                o1[j] = x1[j] * c[j] - x2[j] * s[j];
                o2[j] = x2[j] * c[j] + x1[j] * s[j];
            }
        });
        Ok((CpuStorage::F32(y), self.to.shape((b, h, t), d)))
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
        let (b, h, t, d) = self.dims(l1, l2, l3)?;
        let heads_first = |o: Order| i32::from(o == Order::HeadsFirst);
        let y = cuda::rope(
            (s1, l1),
            (s2, l2),
            (s3, l3),
            (h, t, d),
            (heads_first(self.from), heads_first(self.to)),
        )?;
        Ok((y, self.to.shape((b, h, t), d)))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let back = Rope {
            from: self.to,
            to: self.from,
        };
        let dx = dy.contiguous()?.apply_op3_no_bwd(cos, &sin.neg()?, &back)?;
        Ok((Some(dx), None, None))
    }
}

/// Whether the fused op takes these inputs.
fn fused_rope_on(x: &Tensor, cos: &Tensor, sin: &Tensor) -> bool {
    let same = x.dtype() == cos.dtype() && x.dtype() == sin.dtype();
    same && fused_on(x) && fused_on(cos) && fused_on(sin)
}

/// Rotary embedding of `x` `(B, H, T, D)` by `cos`, `sin` `(B, 1, T, D)` (positions' tables, no
/// gradient); fused on CPU f32 and CUDA.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_rope_on(x, cos, sin) {
        let op = Rope {
            from: Order::HeadsFirst,
            to: Order::HeadsFirst,
        };
        return x
            .contiguous()?
            .apply_op3(&cos.contiguous()?, &sin.contiguous()?, op);
    }
    rope_composed(x, cos, sin)
}

/// Rotary embedding of `x` `(B, T, H, D)`, as the projections make it, returned heads first
/// `(B, H, T, D)`: [`rope`] of `x.transpose(1, 2)` in one pass, without the transposed copy
/// (fused on CPU f32 and CUDA; the same numbers, element for element, on the CPU).
pub fn rope_heads(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_rope_on(x, cos, sin) {
        let op = Rope {
            from: Order::TokensFirst,
            to: Order::HeadsFirst,
        };
        return x
            .contiguous()?
            .apply_op3(&cos.contiguous()?, &sin.contiguous()?, op);
    }
    rope_composed(&x.transpose(1, 2)?.contiguous()?, cos, sin)
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
    use candle_core::{CudaStorage, DType, Layout, Result};

    use crate::fused::launch::{dtype_of, elems_config, kernel, ptx, suffix, view, with_type};

    const PTX: (&str, &str) = ptx!("rope");

    type Arg<'a> = (&'a CudaStorage, &'a Layout);

    /// The rotation of `x` by `cos`, `sin` `(B, 1, T, D)` into a new tensor, `h` heads of `t`
    /// positions of `d` dims; each of x and y heads first (1) or tokens first (0).
    pub fn rope(
        (x, lx): Arg,
        (cos, lc): Arg,
        (sin, ls): Arg,
        (h, t, d): (usize, usize, usize),
        (x_heads_first, y_heads_first): (i32, i32),
    ) -> Result<CudaStorage> {
        let what = "acpo-rope";
        let sfx = suffix(dtype_of(x), what)?;
        with_type!(dtype_of(x), T, {
            let dev = &x.device;
            let (xv, cv, sv) = (
                view::<T>(x, lx, what)?,
                view::<T>(cos, lc, what)?,
                view::<T>(sin, ls, what)?,
            );
            let pairs = xv.len() / 2;
            // SAFETY: the kernel writes both elements of every pair.
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
                .arg(&pairs)
                .arg(&x_heads_first)
                .arg(&y_heads_first);
            // SAFETY: the arguments match rope_* in kernels/rope.cu.
            unsafe { b.launch(elems_config(pairs)) }.w()?;
            Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
        })
    }
}
