//! The rotary position embedding, fused with its backward (the inverse rotation), beside the
//! composed reference. It reads and writes either of two layouts: heads first `(B, H, T, D)`,
//! which attention takes, or tokens first `(B, T, H, D)`, which the q/k projections make. The
//! model rotates q and k from tokens first to heads first in one pass ([`rope_heads`]), so no
//! transpose is made contiguous before (a copy of q and of k per layer, forward and backward).

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D};

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

/// The fused rotation of `x` in layout `from` into layout `to`, its backward recorded where
/// `grad`.
fn fused_rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    (from, to): (Order, Order),
    grad: bool,
) -> Result<Tensor> {
    let (x, cos, sin) = (x.contiguous()?, cos.contiguous()?, sin.contiguous()?);
    let op = Rope { from, to };
    if grad {
        x.apply_op3(&cos, &sin, op)
    } else {
        x.apply_op3_no_bwd(&cos, &sin, &op)
    }
}

/// Rotary embedding of `x` `(B, H, T, D)` by `cos`, `sin` `(B, 1, T, D)` (positions' tables, no
/// gradient); fused on CPU f32 and CUDA.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_rope_on(x, cos, sin) {
        return fused_rope(x, cos, sin, (Order::HeadsFirst, Order::HeadsFirst), true);
    }
    rope_composed(x, cos, sin)
}

/// Rotary embedding of `x` `(B, T, H, D)`, as the projections make it, returned heads first
/// `(B, H, T, D)`: [`rope`] of `x.transpose(1, 2)` in one pass, without the transposed copy
/// (fused on CPU f32 and CUDA; the same numbers, element for element, on the CPU).
pub fn rope_heads(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_rope_on(x, cos, sin) {
        return fused_rope(x, cos, sin, (Order::TokensFirst, Order::HeadsFirst), true);
    }
    rope_composed(&x.transpose(1, 2)?.contiguous()?, cos, sin)
}

/// Rotary embedding of `x` `(B, H, T, D)` returned tokens first `(B, T, H, D)`, no gradient:
/// [`rope`] then the transposed copy, in one pass (fused on CPU f32 and CUDA; the same numbers,
/// element for element). With −sin it is [`rope_heads`]' inverse, the backward written out by
/// hand (`model/qwen/by_hand.rs`) takes the rotated gradients back to the projections' layout.
pub fn rope_tokens_first(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fused_rope_on(x, cos, sin) {
        return fused_rope(x, cos, sin, (Order::HeadsFirst, Order::TokensFirst), false);
    }
    rope_composed(x, cos, sin)?.transpose(1, 2)?.contiguous()
}

/// The reference: x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁], basic ops.
pub fn rope_composed(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// Which table of [`rope_table`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trig {
    Cos,
    Sin,
}

/// The rotary table of positions `(B, T)` (u32) with `inv_freq` `(D/2)` (f32): per position p
/// and column c, cos or sin of `f32(p) · inv_freq[c mod D/2]` (HF's `cat(freqs, freqs)`),
/// `(B, 1, T, D)` in `dtype`: the f32 operations of the model's composed tables
/// (`rope_tables` in src/model/qwen.rs), in one kernel on CUDA.
struct RopeTable {
    trig: Trig,
    dtype: DType,
}

impl RopeTable {
    /// `(b, t, d)` after checking the inputs.
    fn dims(&self, pos: &Layout, inv: &Layout) -> Result<(usize, usize, usize)> {
        match (pos.dims(), inv.dims()) {
            (&[b, t], &[half]) if half > 0 => Ok((b, t, 2 * half)),
            (p, i) => candle_core::bail!(
                "{}: positions {p:?} are not (B, T) or inv_freq {i:?} is not (D/2)",
                self.name()
            ),
        }
    }
}

impl CustomOp2 for RopeTable {
    fn name(&self) -> &'static str {
        "acpo-rope-table"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, t, d) = self.dims(l1, l2)?;
        if self.dtype != DType::F32 {
            candle_core::bail!(
                "{}: the CPU's table is f32 ([`rope_table`] casts it)",
                self.name()
            );
        }
        let pos = match l1.contiguous_offsets() {
            Some((a, z)) => &s1.as_slice::<u32>()?[a..z],
            None => candle_core::bail!("{}: positions must be contiguous", self.name()),
        };
        let inv = slice_f32(s2, l2, self.name())?;
        let half = d / 2;
        let f32s = pos.iter().flat_map(|&p| {
            (0..d).map(move |c| {
                let f = p as f32 * inv[c % half];
                match self.trig {
                    Trig::Cos => f.cos(),
                    Trig::Sin => f.sin(),
                }
            })
        });
        Ok((CpuStorage::F32(f32s.collect()), Shape::from((b, 1, t, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (b, t, d) = self.dims(l1, l2)?;
        let out = cuda::rope_table((s1, l1), (s2, l2), d, self.trig, self.dtype)?;
        Ok((out, Shape::from((b, 1, t, d))))
    }
}

/// [`Trig`]'s table of `positions` `(B, T)` (u32) by `inv_freq` `(D/2)` (f32), `(B, 1, T, D)`
/// in `dtype` (f32 or bf16), no gradient: one kernel on CUDA, its twin on the CPU.
pub fn rope_table(
    positions: &Tensor,
    inv_freq: &Tensor,
    dtype: DType,
    trig: Trig,
) -> Result<Tensor> {
    let (pos, inv) = (positions.contiguous()?, inv_freq.contiguous()?);
    if positions.device().is_cuda() {
        return pos.apply_op2_no_bwd(&inv, &RopeTable { trig, dtype });
    }
    // The CPU rounds f32 to `dtype` as the composed tables do, by candle's cast.
    let op = RopeTable {
        trig,
        dtype: DType::F32,
    };
    pos.apply_op2_no_bwd(&inv, &op)?.to_dtype(dtype)
}

/// The rotary tables `(cos, sin)` of `positions` in two launches where the kernel applies
/// (CUDA, u32 positions, f32 frequencies, f32 or bf16 tables); `None` elsewhere, where the
/// caller composes them (the CPU never takes this path, so no CPU result changes).
pub fn rope_tables(
    positions: &Tensor,
    inv_freq: &Tensor,
    dtype: DType,
) -> Result<Option<(Tensor, Tensor)>> {
    let applies = cfg!(feature = "cuda")
        && positions.device().is_cuda()
        && positions.dtype() == DType::U32
        && inv_freq.dtype() == DType::F32
        && matches!(dtype, DType::F32 | DType::BF16);
    if !applies {
        return Ok(None);
    }
    Ok(Some((
        rope_table(positions, inv_freq, dtype, Trig::Cos)?,
        rope_table(positions, inv_freq, dtype, Trig::Sin)?,
    )))
}

/// The CUDA launches of `kernels/rope.cu` (the `cuda` feature); the CPU twin is this file's `cpu_fwd`.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, DType, Layout, Result};

    use crate::fused::launch::{dtype_of, elems_config, kernel, ptx, suffix, view, with_type};

    use super::Trig;

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

    /// A rotary table `(B, 1, T, D)` in `dtype` of positions `(B, T)` (u32) by `inv_freq`
    /// `(D/2)` (f32).
    pub fn rope_table(
        (pos, lp): Arg,
        (inv, li): Arg,
        d: usize,
        trig: Trig,
        dtype: DType,
    ) -> Result<CudaStorage> {
        let what = "acpo-rope-table";
        let sfx = suffix(dtype, what)?;
        let dev = &pos.device;
        let (pv, iv) = (view::<u32>(pos, lp, what)?, view::<f32>(inv, li, what)?);
        let n = pv.len() * d;
        let (d_i, want_sin) = (d as i32, i32::from(trig == Trig::Sin));
        with_type!(dtype, T, {
            // SAFETY: the kernel writes every element.
            let mut out = unsafe { dev.alloc::<T>(n) }?;
            let f = kernel!(dev, &format!("rope_table_{sfx}"), PTX)?;
            let mut b = f.builder();
            b.arg(&pv)
                .arg(&iv)
                .arg(&mut out)
                .arg(&d_i)
                .arg(&want_sin)
                .arg(&n);
            // SAFETY: the arguments match rope_table_* in kernels/rope.cu.
            unsafe { b.launch(elems_config(n)) }.w()?;
            Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
        })
    }
}
