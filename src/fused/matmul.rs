//! The matrix product on the CPU with its depth blocking fixed, so that its bits do not depend
//! on the CPU's L1 cache.
//!
//! candle's CPU matmul calls the `gemm` crate, whose results are the same whatever the number
//! of threads (each output element is summed by one thread), but not whatever the CPU: each
//! element is a chain of FMAs over a block of the depth k, the blocks added in order, and where
//! a product is larger than 64 × 64 the block length comes from the L1 data cache's size and
//! associativity as Linux reports them (`gemm_common::cache::kernel_params`): 512 on a 32 KiB
//! 8-way L1 (this project's machines, most x86 CPUs to 2020), 1024 on a 48 KiB 12-way one (Intel
//! since Ice Lake, AMD Zen 5). The training step's weight gradients (k = the tokens of a
//! micro-batch, ~1,000) and the lm_head's are such products, and the shipped powered archive's
//! runs were trained where the blocks differed (REPRODUCE.md, "Known sources of
//! nondeterminism").
//!
//! [`matmul`] calls the same gemm block by block instead, with the blocks gemm makes on a
//! 32 KiB 8-way L1 (`k` cut into ⌈k/512⌉ equal blocks), each at most 512 deep, a depth every
//! CPU's gemm sums in one block; the first block writes the product and each later one adds to
//! it, as gemm does between its own blocks. The numbers are therefore those of candle's matmul on
//! the project's machines, bit for bit, on any x86-64 CPU with AVX2 and FMA. The products gemm
//! does not block by cache (both sides at most 64, a row or column vector, the tiny products of
//! its horizontal kernel) go through unchanged. Its backward is made of the same product.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::applies;

/// The depth gemm sums in one block on a 32 KiB 8-way L1; a product this deep or less is one
/// block on every CPU (gemm's `kernel_params` never blocks shallower, whatever the cache).
pub const DEPTH_BLOCK: usize = 512;

/// The product sides below which gemm keeps its fixed block of [`DEPTH_BLOCK`] (its small-size
/// branch of `gemm_basic_generic`).
const GEMM_SMALL_SIDE: usize = 64;

/// gemm's horizontal kernel (a few outputs, each a dot product of two unit-stride vectors)
/// takes products of at most this many outputs; its depth block is fixed (1024).
const GEMM_HORIZONTAL_OUTPUTS: usize = 16 * 16;

/// A matrix operand as gemm reads it: where it starts and its row and column strides.
#[derive(Debug, Clone, Copy)]
struct Operand {
    offset: usize,
    rs: usize,
    cs: usize,
}

impl Operand {
    fn of(l: &Layout, what: &str) -> Result<Operand> {
        match l.stride() {
            &[rs, cs] => Ok(Operand {
                offset: l.start_offset(),
                rs,
                cs,
            }),
            _ => candle_core::bail!("{what}: a matrix product needs 2-D operands"),
        }
    }
}

/// `a (m, k) · b (k, n)` with gemm's depth blocks fixed (see the module doc).
struct MatMul;

impl CustomOp2 for MatMul {
    fn name(&self) -> &'static str {
        "acpo-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (a, b) = (s1.as_slice::<f32>()?, s2.as_slice::<f32>()?);
        let (m, k) = l1.shape().dims2()?;
        let (k2, n) = l2.shape().dims2()?;
        if k != k2 {
            candle_core::bail!("{}: a has {k} columns, b {k2} rows", self.name());
        }
        let (lhs, rhs) = (Operand::of(l1, self.name())?, Operand::of(l2, self.name())?);
        if m == 0 || n == 0 || k == 0 {
            return Ok((CpuStorage::F32(vec![0f32; m * n]), Shape::from((m, n))));
        }
        // Not zeroed first: the first depth block writes every output without reading it, and
        // clearing new buffers was 9 % of an evaluation's profile (docs/PERFORMANCE.md).
        let mut dst = Vec::<f32>::with_capacity(m * n);
        for (i, (d0, len)) in depth_blocks(m, n, k, lhs, rhs).into_iter().enumerate() {
            // SAFETY: the layouts are candle's for storages of these lengths, so every
            // (row, column) they address lies inside `a` and `b` (the depth offset d0 + len
            // stays within k); `dst` has room for m·n, written row-major, and read (added to)
            // only by the blocks after the first, which has written all of it.
            unsafe { gemm_block(dst.as_mut_ptr(), (m, n, len), (a, lhs), (b, rhs), d0, i > 0) };
        }
        // SAFETY: the first block wrote all m·n outputs (k > 0, so there is one).
        unsafe { dst.set_len(m * n) };
        Ok((CpuStorage::F32(dst), Shape::from((m, n))))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // y = a·b: da = g·bᵀ, db = aᵀ·g, with the operands candle's own matmul backward uses.
        Ok((
            Some(product(g, &b.t()?, false)?),
            Some(product(&a.t()?, g, false)?),
        ))
    }
}

/// `dst (m, n) [+]= a[:, d0..d0 + k] · b[d0..d0 + k, :]`: one gemm call as candle makes it
/// (output row-major; writing it without reading when `accumulate` is false, adding to it
/// otherwise).
///
/// # Safety
/// `a` and `b` must hold every element their operands address for `m` rows, `n` columns and
/// depths `d0..d0 + k`; `dst` must have room for `m · n`, initialised when `accumulate`.
unsafe fn gemm_block(
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    (a, lhs): (&[f32], Operand),
    (b, rhs): (&[f32], Operand),
    d0: usize,
    accumulate: bool,
) {
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        n as isize,
        accumulate,
        a.as_ptr().add(lhs.offset + d0 * lhs.cs),
        lhs.cs as isize,
        lhs.rs as isize,
        b.as_ptr().add(rhs.offset + d0 * rhs.rs),
        rhs.cs as isize,
        rhs.rs as isize,
        // dst := alpha·dst + beta·a·b; alpha is read only when accumulating.
        1.0,
        1.0,
        false,
        false,
        false,
        parallelism,
    );
}

/// The depth blocks `(start, len)` to call gemm with: one block where gemm's own blocking does
/// not depend on the cache, else ⌈k/512⌉ blocks of equal length (the last shorter), as gemm cuts
/// k on a 32 KiB 8-way L1.
fn depth_blocks(m: usize, n: usize, k: usize, lhs: Operand, rhs: Operand) -> Vec<(usize, usize)> {
    if k <= DEPTH_BLOCK || !blocked_by_cache(m, n, lhs, rhs) {
        return vec![(0, k)];
    }
    let len = k.div_ceil(k.div_ceil(DEPTH_BLOCK));
    (0..k)
        .step_by(len)
        .map(|d0| (d0, len.min(k - d0)))
        .collect()
}

/// Whether gemm 0.19 takes its cache-blocked path for this product with k > 2: its dispatch
/// (`gemm::gemm`, then `gemm_basic_generic`) replayed on candle's row-major output.
fn blocked_by_cache(m: usize, n: usize, lhs: Operand, rhs: Operand) -> bool {
    // gemm transposes the problem when the output is row-major (its kernels prefer columns).
    let (dst_cs, dst_rs) = (1, n);
    let (m, n, dst_cs, dst_rs, lhs, rhs) = if dst_cs < dst_rs {
        let (l, r) = (
            Operand {
                rs: rhs.cs,
                cs: rhs.rs,
                ..rhs
            },
            Operand {
                rs: lhs.cs,
                cs: lhs.rs,
                ..lhs
            },
        );
        (n, m, dst_rs, dst_cs, l, r)
    } else {
        (m, n, dst_cs, dst_rs, lhs, rhs)
    };
    let horizontal = lhs.cs == 1 && rhs.rs == 1 && m * n <= GEMM_HORIZONTAL_OUTPUTS;
    let gemv = (n <= 1 && ((lhs.rs == 1 && dst_rs == 1) || (lhs.cs == 1 && rhs.rs == 1)))
        || (m <= 1 && ((rhs.cs == 1 && dst_cs == 1) || (rhs.rs == 1 && lhs.cs == 1)));
    let small = m <= GEMM_SMALL_SIDE && n <= GEMM_SMALL_SIDE;
    !(horizontal || gemv || small)
}

/// `a · b` for 2-D `a (m, k)` and `b (k, n)`: on the CPU in f32 with gemm's depth blocks fixed
/// (the module doc), elsewhere candle's matmul. Gradients flow to both.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    product(a, b, true)
}

fn product(a: &Tensor, b: &Tensor, graph: bool) -> Result<Tensor> {
    if !(applies(a) && applies(b) && a.rank() == 2 && b.rank() == 2) {
        return a.matmul(b);
    }
    if graph {
        a.apply_op2(b, MatMul)
    } else {
        a.apply_op2_no_bwd(b, &MatMul)
    }
}
