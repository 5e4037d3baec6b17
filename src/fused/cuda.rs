//! CUDA launches of the kernels in `kernels/*.cu` (compiled to PTX by `build.rs` with the
//! `cuda` feature): the `cuda_fwd` of each fused op, f32 and bf16 storage with f32 arithmetic.
//! Every kernel's CPU twin is the op's `cpu_fwd` and its composed reference; the parity tests
//! are `tests/it/cuda.rs` (they skip, saying so, where no GPU is present).
//!
//! Row kernels run one block of [`ROW_THREADS`] threads per row and reduce in a fixed order, so
//! a result is the same on every run; element-wise kernels use a grid-stride loop.

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result, Shape};

/// Kernel `name` of a PTX module of [`ptx`] (module name, source), loaded on `dev` at its first
/// use. (A macro: candle does not export the type of the function it returns.)
macro_rules! kernel {
    ($dev:expr, $name:expr, $module:expr) => {
        $dev.get_or_load_custom_func($name, $module.0, $module.1)
    };
}

/// The PTX of each kernel file, and the module name it is loaded under.
mod ptx {
    pub const RMS_NORM: (&str, &str) = (
        "acpo_rms_norm",
        include_str!(concat!(env!("OUT_DIR"), "/rms_norm.ptx")),
    );
    pub const SWIGLU: (&str, &str) = (
        "acpo_swiglu",
        include_str!(concat!(env!("OUT_DIR"), "/swiglu.ptx")),
    );
    pub const ROPE: (&str, &str) = (
        "acpo_rope",
        include_str!(concat!(env!("OUT_DIR"), "/rope.ptx")),
    );
    pub const SOFTMAX: (&str, &str) = (
        "acpo_softmax",
        include_str!(concat!(env!("OUT_DIR"), "/softmax.ptx")),
    );
    pub const LOG_PROBS: (&str, &str) = (
        "acpo_log_probs",
        include_str!(concat!(env!("OUT_DIR"), "/log_probs.ptx")),
    );
    pub const SAMPLE: (&str, &str) = (
        "acpo_sample",
        include_str!(concat!(env!("OUT_DIR"), "/sample.ptx")),
    );
    pub const FLASH: (&str, &str) = (
        "acpo_flash_attn",
        include_str!(concat!(env!("OUT_DIR"), "/flash_attn.ptx")),
    );
    pub const ADAMW: (&str, &str) = (
        "acpo_adamw",
        include_str!(concat!(env!("OUT_DIR"), "/adamw.ptx")),
    );
}

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
const ROW_THREADS: u32 = 256;
/// Threads per block, and the most blocks, of the element-wise kernels.
const ELEM_THREADS: u32 = 256;
const ELEM_MAX_BLOCKS: usize = 1 << 16;

/// One block per row; callers launch only when there is a row (a block reads its row).
fn rows_config(rows: usize) -> Result<LaunchConfig> {
    let rows = u32::try_from(rows)
        .map_err(|_| candle_core::Error::Msg(format!("{rows} rows are more than one launch")))?;
    Ok(LaunchConfig {
        grid_dim: (rows.max(1), 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn elems_config(len: usize) -> LaunchConfig {
    let blocks = len
        .div_ceil(ELEM_THREADS as usize)
        .clamp(1, ELEM_MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (ELEM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The contiguous elements of `s` under `l` as `T`.
fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, T>> {
    let slice = s.as_cuda_slice::<T>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(slice.slice(a..b)),
        None => candle_core::bail!("{what}: input must be contiguous"),
    }
}

/// The kernel-name suffix of a storage dtype, or an error naming the op.
fn suffix(dtype: DType, what: &str) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => candle_core::bail!("{what}: no CUDA kernel for {other:?} (f32 and bf16 only)"),
    }
}

fn dtype_of(s: &CudaStorage) -> DType {
    use candle_core::backend::BackendStorage;
    s.dtype()
}

/// Runs `$body` with `$t` bound to the Rust element type of `$dtype` (f32 or bf16).
macro_rules! with_type {
    ($dtype:expr, $t:ident, $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            other => candle_core::bail!("no CUDA kernel for {other:?} (f32 and bf16 only)"),
        }
    };
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

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
        let f = kernel!(dev, &format!("rms_norm_fwd_{sfx}"), ptx::RMS_NORM)?;
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

/// `[dx; dw]` as `(rows + 1, n)`, the CPU twin's layout.
pub fn rms_norm_bwd(
    x: &CudaStorage,
    lx: &Layout,
    w: &CudaStorage,
    lw: &Layout,
    dy: &CudaStorage,
    ldy: &Layout,
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
        let rows_i = rows as i32;
        let f = kernel!(dev, &format!("rms_norm_bwd_dx_{sfx}"), ptx::RMS_NORM)?;
        let mut b = f.builder();
        b.arg(&xv)
            .arg(&wv)
            .arg(&dyv)
            .arg(&mut out)
            .arg(&mut rs)
            .arg(&n_i)
            .arg(&eps);
        if rows > 0 {
            unsafe { b.launch(rows_config(rows)?) }.w()?;
        }
        let f = kernel!(dev, &format!("rms_norm_bwd_dw_{sfx}"), ptx::RMS_NORM)?;
        let mut b = f.builder();
        b.arg(&xv)
            .arg(&dyv)
            .arg(&rs)
            .arg(&mut out)
            .arg(&rows_i)
            .arg(&n_i);
        unsafe { b.launch(elems_config(n)) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((rows + 1, n)),
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

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
        let f = kernel!(dev, &format!("swiglu_fwd_{sfx}"), ptx::SWIGLU)?;
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
        let f = kernel!(dev, &format!("swiglu_bwd_{sfx}"), ptx::SWIGLU)?;
        let mut b = f.builder();
        b.arg(&gv).arg(&uv).arg(&dyv).arg(&mut out).arg(&len);
        unsafe { b.launch(elems_config(len)) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((2, len)),
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// RoPE

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
        let f = kernel!(dev, &format!("rope_{sfx}"), ptx::ROPE)?;
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

// ---------------------------------------------------------------------------------------------
// Attention softmax

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
        let f = kernel!(dev, &format!("attention_softmax_{sfx}"), ptx::SOFTMAX)?;
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

// ---------------------------------------------------------------------------------------------
// Token log-probabilities (f32 logits, u32 targets)

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
    let mut lp = unsafe { dev.alloc::<f32>(rows) }?;
    let f = kernel!(dev, "token_log_probs_f32", ptx::LOG_PROBS)?;
    let v_i = v as i32;
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
    let mut dz = unsafe { dev.alloc::<f32>(zv.len()) }?;
    let f = kernel!(dev, "token_log_probs_bwd_f32", ptx::LOG_PROBS)?;
    let v_i = v as i32;
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

// ---------------------------------------------------------------------------------------------
// Sampling

/// A token per row of `logits` `(rows, V)` (f32) from softmax(z / t), row r's draw `u[r]` (f64):
/// `(rows, 2)` f32 of [token, log-probability].
pub fn sample_full(
    logits: &CudaStorage,
    ll: &Layout,
    u: &CudaStorage,
    lu: &Layout,
    t: f32,
) -> Result<(CudaStorage, Shape)> {
    let what = "acpo-sample";
    let dev = &logits.device;
    let (zv, uv) = (view::<f32>(logits, ll, what)?, view::<f64>(u, lu, what)?);
    let v = ll.dims().last().copied().unwrap_or(1);
    let rows = uv.len();
    if zv.len() != rows * v {
        candle_core::bail!("{what}: {} logits for {rows} draws of {v}", zv.len());
    }
    let mut out = unsafe { dev.alloc::<f32>(2 * rows) }?;
    let f = kernel!(dev, "sample_full_f32", ptx::SAMPLE)?;
    let v_i = v as i32;
    let mut b = f.builder();
    b.arg(&zv).arg(&uv).arg(&mut out).arg(&v_i).arg(&t);
    if rows > 0 {
        unsafe { b.launch(rows_config(rows)?) }.w()?;
    }
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev.clone()),
        Shape::from((rows, 2)),
    ))
}

// ---------------------------------------------------------------------------------------------
// AdamW

/// One AdamW update of `p` (f32 or bf16) with the fp32 gradient `g` and moments `mv` `(2, N)`:
/// `[p; m; v]` as `(3, N)` in f32.
pub fn adamw(
    p: &CudaStorage,
    lp: &Layout,
    g: &CudaStorage,
    lg: &Layout,
    mv: &CudaStorage,
    lmv: &Layout,
    c: &super::AdamWConsts,
) -> Result<(CudaStorage, Shape)> {
    let what = "acpo-adamw";
    let sfx = suffix(dtype_of(p), what)?;
    with_type!(dtype_of(p), T, {
        let dev = &p.device;
        let pv = view::<T>(p, lp, what)?;
        let (gv, mvv) = (view::<f32>(g, lg, what)?, view::<f32>(mv, lmv, what)?);
        let len = pv.len();
        if gv.len() != len || mvv.len() != 2 * len {
            candle_core::bail!(
                "{what}: {len} parameters, {} gradients, {} moments",
                gv.len(),
                mvv.len()
            );
        }
        let mut out = unsafe { dev.alloc::<f32>(3 * len) }?;
        let f = kernel!(dev, &format!("adamw_{sfx}"), ptx::ADAMW)?;
        let mut b = f.builder();
        b.arg(&pv)
            .arg(&gv)
            .arg(&mvv)
            .arg(&mut out)
            .arg(&len)
            .arg(&c.scale)
            .arg(&c.b1)
            .arg(&c.one_minus_b1)
            .arg(&c.b2)
            .arg(&c.one_minus_b2)
            .arg(&c.decay)
            .arg(&c.inv_sqrt_bc2)
            .arg(&c.eps)
            .arg(&c.step);
        unsafe { b.launch(elems_config(len)) }.w()?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((3, len)),
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// Flash attention (kernels/flash_attn.cu; the CPU twin and the semantics: fused/flash.rs)

type Arg<'a> = (&'a CudaStorage, &'a Layout);

/// Warps (rows) per block of the flash kernels: FA_WARPS in flash_attn.cu.
const FLASH_WARPS: usize = 4;

fn flash_grid(rows: usize, y: usize, z: usize) -> Result<LaunchConfig> {
    let x = u32::try_from(rows.div_ceil(FLASH_WARPS).max(1))
        .map_err(|_| candle_core::Error::Msg(format!("{rows} rows are more than one launch")))?;
    Ok(LaunchConfig {
        grid_dim: (x, y as u32, z as u32),
        block_dim: (32 * FLASH_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The first valid key of each sequence (`S` when none): `(B)` i32.
fn flash_first_valid(dims: &super::flash::FlashDims, valid: Arg) -> Result<CudaSlice<i32>> {
    let what = "acpo-flash-attention";
    let dev = &valid.0.device;
    let vv = view::<u8>(valid.0, valid.1, what)?;
    let mut first = unsafe { dev.alloc::<i32>(dims.b.max(1)) }?;
    let f = kernel!(dev, "flash_first_valid", ptx::FLASH)?;
    let s_i = dims.s as i32;
    let mut b = f.builder();
    b.arg(&vv).arg(&s_i).arg(&mut first);
    if dims.b > 0 {
        unsafe { b.launch(rows_config(dims.b)?) }.w()?;
    }
    Ok(first)
}

/// The shape arguments every flash kernel ends with (`FA_ARGS` in flash_attn.cu).
struct FlashInts {
    h: i32,
    kv: i32,
    t: i32,
    s: i32,
    cap: i32,
    d: i32,
    past: i32,
    scale: f32,
}

impl FlashInts {
    fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.h)
            .arg(&self.kv)
            .arg(&self.t)
            .arg(&self.s)
            .arg(&self.cap)
            .arg(&self.d)
            .arg(&self.past)
            .arg(&self.scale);
    }
}

fn flash_ints(dims: &super::flash::FlashDims) -> FlashInts {
    FlashInts {
        h: dims.h as i32,
        kv: dims.kv as i32,
        t: dims.t as i32,
        s: dims.s as i32,
        cap: dims.cap as i32,
        d: dims.d as i32,
        past: dims.past as i32,
        scale: dims.scale,
    }
}

/// O (the storage dtype of q) and the statistics [m, 1/Σ] of each query row `(B, H, T, 2)` in f32.
pub fn flash_fwd(
    dims: &super::flash::FlashDims,
    q: Arg,
    k: Arg,
    v: Arg,
    valid: Arg,
) -> Result<(CudaStorage, CudaStorage)> {
    let what = "acpo-flash-attention";
    let sfx = suffix(dtype_of(q.0), what)?;
    with_type!(dtype_of(q.0), T, {
        let dev = &q.0.device;
        let (qv, kv, vv) = (
            view::<T>(q.0, q.1, what)?,
            view::<T>(k.0, k.1, what)?,
            view::<T>(v.0, v.1, what)?,
        );
        let validv = view::<u8>(valid.0, valid.1, what)?;
        let first = flash_first_valid(dims, valid)?;
        let rows = dims.rows();
        // SAFETY: every query row (warp) writes its D outputs and its two statistics.
        let mut o = unsafe { dev.alloc::<T>(rows * dims.d) }?;
        let mut stats = unsafe { dev.alloc::<f32>(2 * rows.max(1)) }?;
        let n = flash_ints(dims);
        if rows == 0 {
            // nothing to compute (and no block may read an empty row)
        } else if dims.t == 1 && dims.h / dims.kv <= DECODE_MAX_GROUP {
            flash_decode(
                dev,
                dims,
                &n,
                (&qv, &kv, &vv),
                &validv,
                &first,
                &mut o,
                &mut stats,
                sfx,
            )?;
        } else {
            // The tensor-core forward where it applies, else the row kernel: the same arguments.
            let (name, cfg) = match flash_mma_kernel(dims, dtype_of(q.0)) {
                Some(mma) => (
                    mma.to_string(),
                    LaunchConfig {
                        grid_dim: (
                            dims.t.div_ceil(FLASH_MMA_ROWS) as u32,
                            dims.h as u32,
                            dims.b as u32,
                        ),
                        block_dim: (128, 1, 1),
                        shared_mem_bytes: 0,
                    },
                ),
                None => (
                    format!("flash_fwd_{sfx}"),
                    flash_grid(dims.t, dims.h, dims.b)?,
                ),
            };
            let f = kernel!(dev, &name, ptx::FLASH)?;
            let mut b = f.builder();
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&validv)
                .arg(&first)
                .arg(&mut o)
                .arg(&mut stats);
            n.push(&mut b);
            // SAFETY: the arguments match flash_fwd_* and flash_fwd_mma_* in
            // kernels/flash_attn.cu (the same list).
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(o, dev.clone()),
            CudaStorage::wrap_cuda_slice(stats, dev.clone()),
        ))
    })
}

/// Query rows per block of the tensor-core forward (FM_ROWS in flash_attn.cu).
const FLASH_MMA_ROWS: usize = 64;
/// Keys per split of the decode kernel (FD_SPLIT) and the most query heads per KV head it
/// takes (FD_MAXG); a model with more uses the row kernel.
const DECODE_SPLIT: usize = 256;
const DECODE_MAX_GROUP: usize = 8;

/// The tensor-core forward for these shapes, if there is one: bf16, head dim 64 or 128, more
/// than one query position (one position decodes: [`flash_decode`]).
fn flash_mma_kernel(dims: &super::flash::FlashDims, dtype: DType) -> Option<&'static str> {
    match (dtype, dims.d) {
        (DType::BF16, 64) if dims.t > 1 => Some("flash_fwd_mma_d64_bf16"),
        (DType::BF16, 128) if dims.t > 1 => Some("flash_fwd_mma_d128_bf16"),
        _ => None,
    }
}

/// One decode step's attention (T = 1): split-K partials over [`DECODE_SPLIT`] keys per block,
/// each KV head read once for all its query heads, then their merge in split order.
#[allow(clippy::too_many_arguments)]
fn flash_decode<T: CudaDType>(
    dev: &CudaDevice,
    dims: &super::flash::FlashDims,
    n: &FlashInts,
    (q, k, v): (&CudaView<T>, &CudaView<T>, &CudaView<T>),
    valid: &CudaView<u8>,
    first: &CudaSlice<i32>,
    o: &mut CudaSlice<T>,
    stats: &mut CudaSlice<f32>,
    sfx: &str,
) -> Result<()> {
    let nsplit = dims.s.div_ceil(DECODE_SPLIT).max(1);
    // SAFETY: every (row, split) partial is written by its block, empty splits included.
    let mut part = unsafe { dev.alloc::<f32>(dims.b * dims.h * nsplit * (2 + dims.d)) }?;
    let nsplit_i = nsplit as i32;
    let f = kernel!(dev, &format!("flash_decode_split_{sfx}"), ptx::FLASH)?;
    let mut b = f.builder();
    b.arg(q)
        .arg(k)
        .arg(v)
        .arg(valid)
        .arg(first)
        .arg(&mut part)
        .arg(&nsplit_i);
    n.push(&mut b);
    let cfg = LaunchConfig {
        grid_dim: (nsplit as u32, dims.kv as u32, dims.b as u32),
        block_dim: (32 * FLASH_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match flash_decode_split_* in kernels/flash_attn.cu.
    unsafe { b.launch(cfg) }.w()?;
    let (h_i, d_i) = (dims.h as i32, dims.d as i32);
    let f = kernel!(dev, &format!("flash_decode_combine_{sfx}"), ptx::FLASH)?;
    let mut b = f.builder();
    b.arg(&part)
        .arg(o)
        .arg(stats)
        .arg(&nsplit_i)
        .arg(&h_i)
        .arg(&d_i);
    let cfg = LaunchConfig {
        grid_dim: (dims.h as u32, dims.b as u32, 1),
        block_dim: (super::flash::FLASH_MAX_HEAD_DIM as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match flash_decode_combine_* in kernels/flash_attn.cu.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// dQ, dK, dV (the storage dtype of q): the delta, dQ and dK/dV kernels.
#[allow(clippy::too_many_arguments)]
pub fn flash_bwd(
    dims: &super::flash::FlashDims,
    q: Arg,
    k: Arg,
    v: Arg,
    o: Arg,
    dout: Arg,
    stats: Arg,
    valid: Arg,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let what = "acpo-flash-attention-bwd";
    let sfx = suffix(dtype_of(q.0), what)?;
    with_type!(dtype_of(q.0), T, {
        let dev = &q.0.device;
        let (qv, kv, vv, ov, dov) = (
            view::<T>(q.0, q.1, what)?,
            view::<T>(k.0, k.1, what)?,
            view::<T>(v.0, v.1, what)?,
            view::<T>(o.0, o.1, what)?,
            view::<T>(dout.0, dout.1, what)?,
        );
        let statsv = view::<f32>(stats.0, stats.1, what)?;
        let validv = view::<u8>(valid.0, valid.1, what)?;
        let first = flash_first_valid(dims, valid)?;
        let rows = dims.rows();
        let keys = dims.b * dims.kv * dims.s;
        let n = flash_ints(dims);
        // SAFETY: each kernel writes every row it owns.
        let mut delta = unsafe { dev.alloc::<f32>(rows.max(1)) }?;
        let mut dq = unsafe { dev.alloc::<T>(rows * dims.d) }?;
        let mut dk = unsafe { dev.alloc::<T>(keys * dims.d) }?;
        let mut dv = unsafe { dev.alloc::<T>(keys * dims.d) }?;
        if rows > 0 {
            let f = kernel!(dev, &format!("flash_delta_{sfx}"), ptx::FLASH)?;
            let rows_i = rows as i32;
            let mut b = f.builder();
            b.arg(&ov).arg(&dov).arg(&mut delta).arg(&rows_i).arg(&n.d);
            unsafe { b.launch(flash_grid(rows, 1, 1)?) }.w()?;

            let f = kernel!(dev, &format!("flash_dq_{sfx}"), ptx::FLASH)?;
            let mut b = f.builder();
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&dov)
                .arg(&statsv)
                .arg(&delta)
                .arg(&validv)
                .arg(&first);
            b.arg(&mut dq);
            n.push(&mut b);
            unsafe { b.launch(flash_grid(dims.t, dims.h, dims.b)?) }.w()?;

            let f = kernel!(dev, &format!("flash_dkdv_{sfx}"), ptx::FLASH)?;
            let mut b = f.builder();
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&dov)
                .arg(&statsv)
                .arg(&delta)
                .arg(&validv)
                .arg(&first);
            b.arg(&mut dk).arg(&mut dv);
            n.push(&mut b);
            unsafe { b.launch(flash_grid(dims.s, dims.kv, dims.b)?) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(dq, dev.clone()),
            CudaStorage::wrap_cuda_slice(dk, dev.clone()),
            CudaStorage::wrap_cuda_slice(dv, dev.clone()),
        ))
    })
}
