//! The CUDA launches of flash attention (the `cuda` feature), and which kernel takes a call:
//! - `kernels/flash_mma.cu`, the tensor-core forward and backward (FA2 on `mma.sync`): bf16 at
//!   head dim 64 or 128, every operand 16-byte aligned, more than one query position;
//! - for one query position, the pipelined decode of `kernels/flash_decode.cu` (head dim 64 or
//!   128, at most 8 query heads per KV head, K and V 16-byte aligned), else the split-K decode of
//!   `kernels/flash_attn.cu`;
//! - the row kernels of `kernels/flash_attn.cu` for everything else (f32, other head dims), the
//!   oracle of the tensor-core kernels.
//!
//! The CPU twin and the semantics are in the parent module; `tests/it/cuda.rs` holds every path
//! to it, and `kernels/check/flash_check.cu` checks and times the kernels without this build.

use std::cell::RefCell;

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result};

use super::{tensor_cores_take, FlashBackward, FlashDims, FLASH_MAX_HEAD_DIM};
use crate::fused::launch::{
    allow_smem, dtype_of, elems_config, grid_dim, kernel, ptx, rows_config, sizes, suffix, view,
    with_type,
};

const ROW_PTX: (&str, &str) = ptx!("flash_attn");
const MMA_PTX: (&str, &str) = ptx!("flash_mma");
const DECODE_PTX: (&str, &str) = ptx!("flash_decode");

type Arg<'a> = (&'a CudaStorage, &'a Layout);

/// Warps (rows) per block of the row kernels and of the decode kernel (the tensor-core kernels'
/// are per head dim: [`mma_fwd`], [`mma_dkdv`]); keys per split of the decode kernel and the most query
/// heads per KV head it takes (a model with more uses the row kernel): kernels/launch.cuh.
const ROW_WARPS: usize = sizes::FA_WARPS as usize;
const DECODE_WARPS: u32 = sizes::FD_WARPS;
const DECODE_SPLIT: usize = sizes::FD_SPLIT as usize;
const DECODE_MAX_GROUP: usize = sizes::FD_MAXG as usize;
/// The pipelined decode's threads per block, keys per chunk (the unit of its reduction order),
/// most query heads per KV head, and the grid size above which a block takes several chunks:
/// kernels/launch.cuh.
const PIPE_THREADS: u32 = sizes::FDP_THREADS;
const PIPE_CHUNK: usize = sizes::FDP_CHUNK as usize;
const PIPE_MAX_GROUP: usize = sizes::FDP_MAXG as usize;
const PIPE_FILL_BLOCKS: usize = sizes::FDP_FILL_BLOCKS as usize;
const _: () = assert!(FLASH_MAX_HEAD_DIM as u32 == sizes::FA_MAXD);
const _: () = assert!(PIPE_MAX_GROUP == super::PIPE_MAX_GROUP);

/// A tensor-core kernel's launch at one head dim: rows per block, threads per block, bytes of
/// dynamic shared memory (a kernel given less traps).
#[derive(Clone, Copy)]
struct MmaLaunch {
    rows: usize,
    threads: u32,
    smem: u32,
}

/// The tensor-core forward's launch at head dim `d` (64 or 128, [`mma_dim`]): `fm_fwd_rows`,
/// `fm_fwd_threads` and `fm_smem_fwd` of launch.cuh, as nvcc computed them (128 query rows a
/// block at head dim 128, 64 at 64).
fn mma_fwd(d: usize) -> MmaLaunch {
    debug_assert!(matches!(d, 64 | 128));
    if d == 64 {
        MmaLaunch {
            rows: sizes::FM_FWD_ROWS_D64 as usize,
            threads: sizes::FM_FWD_THREADS_D64,
            smem: sizes::FM_SMEM_FWD_D64,
        }
    } else {
        MmaLaunch {
            rows: sizes::FM_FWD_ROWS_D128 as usize,
            threads: sizes::FM_FWD_THREADS_D128,
            smem: sizes::FM_SMEM_FWD_D128,
        }
    }
}
/// The dQ kernel's launch at head dim `d`: the forward's blocks, `fm_smem_dq`.
fn mma_dq(d: usize) -> MmaLaunch {
    MmaLaunch {
        smem: if d == 64 {
            sizes::FM_SMEM_DQ_D64
        } else {
            sizes::FM_SMEM_DQ_D128
        },
        ..mma_fwd(d)
    }
}

/// The dK/dV kernel's launch at head dim `d`: `fm_dkdv_rows` keys (128 at head dim 128, 64 at
/// 64), `fm_dkdv_threads`, `fm_smem_dkdv`.
fn mma_dkdv(d: usize) -> MmaLaunch {
    debug_assert!(matches!(d, 64 | 128));
    if d == 64 {
        MmaLaunch {
            rows: sizes::FM_DKDV_ROWS_D64 as usize,
            threads: sizes::FM_DKDV_THREADS_D64,
            smem: sizes::FM_SMEM_DKDV_D64,
        }
    } else {
        MmaLaunch {
            rows: sizes::FM_DKDV_ROWS_D128 as usize,
            threads: sizes::FM_DKDV_THREADS_D128,
            smem: sizes::FM_SMEM_DKDV_D128,
        }
    }
}

/// The backward in 5 products' dK/dV kernel at head dim `d` (kernels/flash_mma.cu,
/// `flash_dkdvq_*`): the dK/dV kernel's blocks with room for a query tile's dS and the block's
/// ticket, `fm_smem_dkdvq`.
fn mma_dkdvq(d: usize) -> MmaLaunch {
    MmaLaunch {
        smem: if d == 64 {
            sizes::FM_SMEM_DKDVQ_D64
        } else {
            sizes::FM_SMEM_DKDVQ_D128
        },
        ..mma_dkdv(d)
    }
}

// The fused kernel's shared memory fits a block (allow_smem checks it again at the launch).
const _: () = assert!(
    sizes::FM_SMEM_DKDVQ_D64 <= sizes::SMEM_OPT_IN_LIMIT
        && sizes::FM_SMEM_DKDVQ_D128 <= sizes::SMEM_OPT_IN_LIMIT
);

/// Query rows per tile of the tensor-core backward: the unit the 5-product kernel's counters
/// order dQ's adds by (`FM_COLS`).
const MMA_TILE: usize = sizes::FM_COLS as usize;

/// The pipelined decode's head dim for these inputs, if it takes them: head dim 64 or 128, at
/// most [`PIPE_MAX_GROUP`] query heads per KV head, K and V each starting on 16 bytes (its
/// cp.async copies move 16 bytes; a row is 128 or 256 bytes in bf16, so every row is aligned).
fn pipe_dim(dims: &FlashDims, dtype: DType, k: &Layout, v: &Layout) -> Option<usize> {
    let per16 = 16 / dtype.size_in_bytes();
    let aligned = k.start_offset().is_multiple_of(per16) && v.start_offset().is_multiple_of(per16);
    (matches!(dims.d, 64 | 128) && dims.h / dims.kv <= PIPE_MAX_GROUP && aligned).then_some(dims.d)
}

/// Dynamic shared memory of the pipelined decode at head dim `d` ([`pipe_dim`]) in `dtype`:
/// `fdp_smem` of launch.cuh, as nvcc computed it.
fn pipe_smem(d: usize, dtype: DType) -> u32 {
    match (d, dtype) {
        (64, DType::BF16) => sizes::FDP_SMEM_D64_BF16,
        (64, DType::U8) => sizes::FDP_SMEM_D64_FP8,
        (64, _) => sizes::FDP_SMEM_D64_F32,
        (_, DType::BF16) => sizes::FDP_SMEM_D128_BF16,
        (_, DType::U8) => sizes::FDP_SMEM_D128_FP8,
        _ => sizes::FDP_SMEM_D128_F32,
    }
}

/// Chunks per block of the pipelined decode: one, unless the grid would exceed
/// [`PIPE_FILL_BLOCKS`] blocks (then fewer, longer blocks). It decides which block computes a
/// chunk, not what the chunk's partial is: a row's bits do not depend on it, nor on the batch
/// (`kernels/check/flash_check.cu` checks both).
fn pipe_chunks_per_block(b: usize, kv: usize, nchunk: usize) -> usize {
    (b * kv * nchunk / PIPE_FILL_BLOCKS).clamp(1, nchunk.max(1))
}

/// The tensor-core kernels' head dim for these inputs, if they take them: bf16, head dim 64 or
/// 128, each operand starting on 16 bytes (cp.async and ldmatrix move 16 bytes at a time).
fn mma_dim(dims: &FlashDims, dtype: DType, operands: &[&Layout]) -> Option<usize> {
    let aligned = operands.iter().all(|l| l.start_offset() % 8 == 0);
    (tensor_cores_take(dtype, dims.d) && aligned).then_some(dims.d)
}

fn row_grid(rows: usize, y: usize, z: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            grid_dim(rows.div_ceil(ROW_WARPS), "flash attention")?,
            y as u32,
            z as u32,
        ),
        block_dim: (32 * ROW_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// A tensor-core launch over `rows` rows in blocks of `l.rows`, with `l.smem` bytes of dynamic
/// shared memory (the kernel's limit raised to it first).
fn mma_grid(rows: usize, y: usize, z: usize, l: MmaLaunch) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            grid_dim(rows.div_ceil(l.rows), "flash attention")?,
            y as u32,
            z as u32,
        ),
        block_dim: (l.threads, 1, 1),
        shared_mem_bytes: l.smem,
    })
}

/// Allows kernel `f` `smem` bytes of dynamic shared memory (more than the default needs asking).
/// The kernel for `op` and its launch over `rows` × `y` × `z`: on tensor cores
/// (`{op}_mma_d{d}_bf16`, launched as `launch(d)` says, its dynamic shared memory allowed) where
/// `mma` is `Some(d)`, else the row kernel `{op}_{sfx}`. Both take the same arguments. A macro
/// because candle's loaded-kernel type, whose `builder` launches, cannot be named outside candle.
macro_rules! pick {
    ($dev:expr, $op:expr, $sfx:expr, $mma:expr, $launch:expr, ($rows:expr, $y:expr, $z:expr) $(,)?) => {
        match $mma {
            Some(d) => {
                let l: MmaLaunch = $launch(d);
                let f = kernel!($dev, &format!("{}_mma_d{d}_bf16", $op), MMA_PTX)?;
                allow_smem(&f, l.smem, "flash attention")?;
                (f, mma_grid($rows, $y, $z, l)?)
            }
            None => (
                kernel!($dev, &format!("{}_{}", $op, $sfx), ROW_PTX)?,
                row_grid($rows, $y, $z)?,
            ),
        }
    };
}

/// The first valid key of each of `b` sequences of `s` keys (`S` when none): `(B)`, the kernel's
/// `int`s (never negative) held as u32, the dtype a candle tensor of them has.
pub fn first_valid(b: usize, s: usize, valid: Arg) -> Result<CudaSlice<u32>> {
    let what = "acpo-flash-attention";
    let dev = &valid.0.device;
    let vv = view::<u8>(valid.0, valid.1, what)?;
    if vv.len() != b * s {
        candle_core::bail!(
            "{what}: {} valid bits for {b} sequences of {s} keys",
            vv.len()
        );
    }
    // SAFETY: one block per sequence writes its entry.
    let mut first = unsafe { dev.alloc::<u32>(b.max(1)) }?;
    let f = kernel!(dev, "flash_first_valid", ROW_PTX)?;
    let s_i = i32::try_from(s).map_err(|_| candle_core::Error::Msg(format!("{what}: {s} keys")))?;
    let mut bld = f.builder();
    bld.arg(&vv).arg(&s_i).arg(&mut first);
    if b > 0 {
        // SAFETY: the arguments match flash_first_valid in kernels/flash_attn.cu (its `int`
        // output has the u32 slice's size).
        unsafe { bld.launch(rows_config(b)?) }.w()?;
    }
    Ok(first)
}

/// Each sequence's first valid key: the one given (`(B)` u32, [`first_valid`] of the same
/// valid bits, made once for the layers that share them), else computed here into `own`.
fn first_or_own<'a>(
    dims: &FlashDims,
    valid: Arg,
    given: Option<Arg<'a>>,
    own: &'a mut Option<CudaSlice<u32>>,
) -> Result<CudaView<'a, u32>> {
    let what = "acpo-flash-attention";
    match given {
        Some((s, l)) => {
            let v = view::<u32>(s, l, what)?;
            if v.len() != dims.b {
                candle_core::bail!("{what}: {} first keys for {} sequences", v.len(), dims.b);
            }
            Ok(v)
        }
        None => {
            let made = own.insert(first_valid(dims.b, dims.s, valid)?);
            Ok(made.slice(0..dims.b.max(1)))
        }
    }
}

/// The shape arguments every flash kernel ends with (`FA_ARGS` in flash.cuh).
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
    fn of(dims: &FlashDims) -> FlashInts {
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

/// O (the storage dtype of q) and the statistics [m, 1/Σ] of each query row `(B, H, T, 2)` in f32.
pub fn flash_fwd(
    dims: &FlashDims,
    q: Arg,
    k: Arg,
    v: Arg,
    (valid, first): (Arg, Option<Arg>),
) -> Result<(CudaStorage, CudaStorage)> {
    let what = "acpo-flash-attention";
    // u8 keys and values are an FP8 cache's E4M3 bytes (fused::to_fp8_bytes)
    if dtype_of(k.0) == DType::U8 {
        return fp8_decode(dims, q, k, v, (valid, first));
    }
    let dtype = dtype_of(q.0);
    let sfx = suffix(dtype, what)?;
    with_type!(dtype, T, {
        let dev = &q.0.device;
        let (qv, kv, vv) = (
            view::<T>(q.0, q.1, what)?,
            view::<T>(k.0, k.1, what)?,
            view::<T>(v.0, v.1, what)?,
        );
        let validv = view::<u8>(valid.0, valid.1, what)?;
        let mut own = None;
        let first = first_or_own(dims, valid, first, &mut own)?;
        let rows = dims.rows();
        // SAFETY: every query row is written by the kernel that owns it, O and statistics.
        let mut o = unsafe { dev.alloc::<T>(rows * dims.d) }?;
        let mut stats = unsafe { dev.alloc::<f32>(2 * rows.max(1)) }?;
        let n = FlashInts::of(dims);
        if rows == 0 {
            // nothing to compute (and no block may read an empty row)
        } else if dims.t == 1 && dims.h / dims.kv <= DECODE_MAX_GROUP {
            decode(
                dev,
                dims,
                &n,
                (&qv, &kv, &vv),
                &validv,
                &first,
                &mut o,
                &mut stats,
                Kernels {
                    sfx,
                    kv_sfx: sfx,
                    pipe: pipe_dim(dims, dtype, k.1, v.1).map(|d| (d, pipe_smem(d, dtype))),
                },
            )?;
        } else {
            // The tensor-core forward where it applies, else the row kernel: the same arguments.
            let (f, cfg) = pick!(
                dev,
                "flash_fwd",
                sfx,
                mma_dim(dims, dtype, &[q.1, k.1, v.1]),
                mma_fwd,
                (dims.t, dims.h, dims.b),
            );
            let mut b = f.builder();
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&validv)
                .arg(&first)
                .arg(&mut o)
                .arg(&mut stats);
            n.push(&mut b);
            // SAFETY: the arguments match flash_fwd_* (flash_attn.cu) and flash_fwd_mma_*
            // (flash_mma.cu), the same list.
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(o, dev.clone()),
            CudaStorage::wrap_cuda_slice(stats, dev.clone()),
        ))
    })
}

/// An FP8 cache's keys or values: E4M3 bytes, stored as u8 (`fused::to_fp8_bytes`).
fn fp8_view<'a>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, u8>> {
    if dtype_of(s) != DType::U8 {
        candle_core::bail!("{what}: keys and values must be one dtype (E4M3 bytes, u8)");
    }
    view::<u8>(s, l, what)
}

/// One decode step's attention over an FP8 KV cache (keys and values E4M3 bytes, as
/// `model::qwen::KvCacheDtype::Fp8E4m3` stores them on a GPU; the query bf16): the pipelined
/// kernel's `*_fp8` instance, which gives the bf16 kernel's bits on the same values, its last
/// blocks merging into O. O bf16. A prefill over an FP8 cache reads it cast to bf16 (the model does).
fn fp8_decode(
    dims: &FlashDims,
    q: Arg,
    k: Arg,
    v: Arg,
    (valid, first): (Arg, Option<Arg>),
) -> Result<(CudaStorage, CudaStorage)> {
    let what = "acpo-flash-attention (FP8 KV cache)";
    let pipe = pipe_dim(dims, DType::U8, k.1, v.1);
    if dtype_of(q.0) != DType::BF16 || dims.t != 1 || pipe.is_none() {
        candle_core::bail!(
            "{what}: only the pipelined decode reads an FP8 cache: one new position (got {}), a \
             bf16 query (got {:?}), head dim 64 or 128 (got {}), at most {PIPE_MAX_GROUP} query \
             heads per KV head (got {}), the cache on 16 bytes",
            dims.t,
            dtype_of(q.0),
            dims.d,
            dims.h / dims.kv
        );
    }
    let dev = &q.0.device;
    let qv = view::<half::bf16>(q.0, q.1, what)?;
    let (kv, vv) = (fp8_view(k.0, k.1, what)?, fp8_view(v.0, v.1, what)?);
    let validv = view::<u8>(valid.0, valid.1, what)?;
    let mut own = None;
    let first = first_or_own(dims, valid, first, &mut own)?;
    let rows = dims.rows();
    // SAFETY: every query row of O and the statistics is written by its row's merge.
    let mut o = unsafe { dev.alloc::<half::bf16>(rows * dims.d) }?;
    let mut stats = unsafe { dev.alloc::<f32>(2 * rows.max(1)) }?;
    if rows > 0 {
        decode(
            dev,
            dims,
            &FlashInts::of(dims),
            (&qv, &kv, &vv),
            &validv,
            &first,
            &mut o,
            &mut stats,
            Kernels {
                sfx: "bf16",
                kv_sfx: "fp8",
                pipe: pipe.map(|d| (d, pipe_smem(d, DType::U8))),
            },
        )?;
    }
    Ok((
        CudaStorage::wrap_cuda_slice(o, dev.clone()),
        CudaStorage::wrap_cuda_slice(stats, dev.clone()),
    ))
}

/// Which decode kernels a call takes: `sfx` names the query's dtype (the split-K kernel's and the
/// combine's), `kv_sfx` the pipelined kernel's instance (the keys' and values' dtype), `pipe`
/// its head dim and dynamic shared memory where it applies.
struct Kernels<'a> {
    sfx: &'a str,
    kv_sfx: &'a str,
    pipe: Option<(usize, u32)>,
}

/// One decode step's attention (T = 1), each KV head read once for all its query heads, as
/// partials over the keys merged in key order: where `pipe` is `Some((d, smem))`, the pipelined
/// kernel (`flash_decode_pipe_d{d}_*` with `smem` bytes of dynamic shared memory, chunks of
/// [`PIPE_CHUNK`] keys, [`pipe_chunks_per_block`] a block), whose last block of each (row, KV
/// head) merges the row's partials in the same launch ([`with_arrivals`]); else the split-K
/// kernel ([`DECODE_SPLIT`] keys a block, q, k and v of one dtype) and `flash_decode_combine_*`.
#[allow(clippy::too_many_arguments)]
fn decode<Q: DeviceRepr, T: DeviceRepr>(
    dev: &CudaDevice,
    dims: &FlashDims,
    n: &FlashInts,
    (q, k, v): (&CudaView<Q>, &CudaView<T>, &CudaView<T>),
    valid: &CudaView<u8>,
    first: &CudaView<u32>,
    o: &mut CudaSlice<Q>,
    stats: &mut CudaSlice<f32>,
    Kernels { sfx, kv_sfx, pipe }: Kernels,
) -> Result<()> {
    let nsplit = match pipe {
        Some(_) => dims.s.div_ceil(PIPE_CHUNK).max(1),
        None => dims.s.div_ceil(DECODE_SPLIT).max(1),
    };
    // SAFETY: the split-K kernel writes every (row, split) partial, empty ones included, and
    // the pipelined kernel's merge reads only those of a row's chunks that hold keys.
    let mut part = unsafe { dev.alloc::<f32>(dims.b * dims.h * nsplit * (2 + dims.d)) }?;
    let nsplit_i = nsplit as i32;
    if let Some((d, smem)) = pipe {
        let cpb = pipe_chunks_per_block(dims.b, dims.kv, nsplit);
        let cpb_i = cpb as i32;
        let g = group_suffix(dims.h, dims.kv);
        let f = kernel!(
            dev,
            &format!("flash_decode_pipe_d{d}_{kv_sfx}{g}"),
            DECODE_PTX
        )?;
        allow_smem(&f, smem, "flash attention")?;
        let cfg = LaunchConfig {
            grid_dim: (
                grid_dim(nsplit.div_ceil(cpb), "flash decode")?,
                dims.kv as u32,
                dims.b as u32,
            ),
            block_dim: (PIPE_THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        return with_arrivals(dev, dims.b * dims.kv, |count| {
            let mut b = f.builder();
            b.arg(q)
                .arg(k)
                .arg(v)
                .arg(valid)
                .arg(first)
                .arg(&mut part)
                .arg(o)
                .arg(stats)
                .arg(count)
                .arg(&nsplit_i)
                .arg(&cpb_i);
            n.push(&mut b);
            // SAFETY: the arguments match flash_decode_pipe_* in kernels/flash_decode.cu, the
            // kernel's dynamic shared memory is what launch.cuh's fdp_smem gives for (d, T),
            // and `count` holds (B, KV) zeros.
            unsafe { b.launch(cfg) }.w()?;
            Ok(())
        });
    }
    if kv_sfx != sfx {
        candle_core::bail!("flash decode: the split-K kernel reads q, k and v of one dtype");
    }
    let f = kernel!(dev, &format!("flash_decode_split_{sfx}"), ROW_PTX)?;
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
        grid_dim: (
            grid_dim(nsplit, "flash decode")?,
            dims.kv as u32,
            dims.b as u32,
        ),
        block_dim: (32 * DECODE_WARPS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match flash_decode_split_* in kernels/flash_attn.cu.
    unsafe { b.launch(cfg) }.w()?;
    combine(
        dev,
        sfx,
        &part,
        (o, stats),
        nsplit,
        (dims.b, dims.h, dims.d),
    )
}

/// `flash_decode_combine_{sfx}`: each (row, head)'s `n` partials in `part` merged in key order
/// into O and the statistics.
fn combine<Q: DeviceRepr>(
    dev: &CudaDevice,
    sfx: &str,
    part: &CudaSlice<f32>,
    (o, stats): (&mut CudaSlice<Q>, &mut CudaSlice<f32>),
    n: usize,
    (b, h, d): (usize, usize, usize),
) -> Result<()> {
    let (n_i, h_i, d_i) = (n as i32, h as i32, d as i32);
    let f = kernel!(dev, &format!("flash_decode_combine_{sfx}"), ROW_PTX)?;
    let mut args = f.builder();
    args.arg(part)
        .arg(o)
        .arg(stats)
        .arg(&n_i)
        .arg(&h_i)
        .arg(&d_i);
    let cfg = LaunchConfig {
        grid_dim: (h as u32, b as u32, 1),
        block_dim: (FLASH_MAX_HEAD_DIM as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match flash_decode_combine_* in kernels/flash_attn.cu.
    unsafe { args.launch(cfg) }.w()?;
    Ok(())
}

/// One decode step's attention through a paged pool's block tables ([`super::paged`]): the
/// pipelined kernel's paged instance (`flash_decode_paged_d{d}_*`, chunks of [`PIPE_CHUNK`]
/// keys from each row's first, [`pipe_chunks_per_block`] a block, each row's partials merged
/// in chunk order by its last block). O in the storage dtype of q.
pub(super) fn paged_decode(
    dims: &super::PagedDims,
    q: Arg,
    k: Arg,
    v: Arg,
    tables: Arg,
    lens: Arg,
) -> Result<CudaStorage> {
    let what = "acpo-paged-decode";
    let dtype = dtype_of(q.0);
    let sfx = suffix(dtype, what)?;
    // An FP8 pool (keys and values E4M3) under a bf16 model: the kernel's `*_fp8` instance.
    let kv_dtype = dtype_of(k.0);
    let fp8 = kv_dtype == DType::U8; // E4M3 bytes
    if (fp8 && dtype != DType::BF16) || (!fp8 && kv_dtype != dtype) || dtype_of(v.0) != kv_dtype {
        candle_core::bail!(
            "{what}: a {dtype:?} query over {kv_dtype:?} keys and {:?} values (the pool in the \
             query's dtype, or FP8 E4M3 under bf16)",
            dtype_of(v.0)
        );
    }
    let per16 = 16 / kv_dtype.size_in_bytes();
    let aligned =
        k.1.start_offset().is_multiple_of(per16) && v.1.start_offset().is_multiple_of(per16);
    if !matches!(dims.d, 64 | 128) || dims.h / dims.kv > PIPE_MAX_GROUP || !aligned {
        candle_core::bail!(
            "{what}: head dim {} with {} query heads per KV head (the kernel takes 64 or 128 and \
             at most {PIPE_MAX_GROUP}, pools on 16 bytes)",
            dims.d,
            dims.h / dims.kv
        );
    }
    let dev = &q.0.device;
    let (tv, lv) = (
        view::<u32>(tables.0, tables.1, what)?,
        view::<u32>(lens.0, lens.1, what)?,
    );
    let names = Kernels {
        sfx,
        kv_sfx: if fp8 { "fp8" } else { sfx },
        pipe: Some((dims.d, pipe_smem(dims.d, kv_dtype))),
    };
    let o = if fp8 {
        let qv = view::<half::bf16>(q.0, q.1, what)?;
        let (kv, vv) = (fp8_view(k.0, k.1, what)?, fp8_view(v.0, v.1, what)?);
        CudaStorage::wrap_cuda_slice(
            paged_launch(dev, dims, (&qv, &kv, &vv), (&tv, &lv), names)?,
            dev.clone(),
        )
    } else {
        with_type!(dtype, T, {
            let (qv, kv, vv) = (
                view::<T>(q.0, q.1, what)?,
                view::<T>(k.0, k.1, what)?,
                view::<T>(v.0, v.1, what)?,
            );
            CudaStorage::wrap_cuda_slice(
                paged_launch(dev, dims, (&qv, &kv, &vv), (&tv, &lv), names)?,
                dev.clone(),
            )
        })
    };
    Ok(o)
}

/// [`paged_decode`]'s launch: the pipelined kernel's paged instance (`kv_sfx`). O in Q.
fn paged_launch<Q: DeviceRepr, T: DeviceRepr>(
    dev: &CudaDevice,
    dims: &super::PagedDims,
    (qv, kv, vv): (&CudaView<Q>, &CudaView<T>, &CudaView<T>),
    (tv, lv): (&CudaView<u32>, &CudaView<u32>),
    Kernels { kv_sfx, pipe, .. }: Kernels,
) -> Result<CudaSlice<Q>> {
    let smem = pipe.map_or(0, |(_, smem)| smem);
    let rows = dims.b * dims.h;
    let nchunk = dims.longest.div_ceil(PIPE_CHUNK).max(1);
    // SAFETY: the merge reads only the partials of a row's chunks that hold keys, each written
    // by its block, and writes every row of O and of the statistics.
    let mut part = unsafe { dev.alloc::<f32>((rows * nchunk * (2 + dims.d)).max(1)) }?;
    let mut o = unsafe { dev.alloc::<Q>((rows * dims.d).max(1)) }?;
    let mut stats = unsafe { dev.alloc::<f32>(2 * rows.max(1)) }?;
    if rows > 0 {
        let cpb = pipe_chunks_per_block(dims.b, dims.kv, nchunk);
        let g = group_suffix(dims.h, dims.kv);
        let f = kernel!(
            dev,
            &format!("flash_decode_paged_d{}_{kv_sfx}{g}", dims.d),
            DECODE_PTX
        )?;
        allow_smem(&f, smem, "flash attention")?;
        let ints = [
            nchunk as i32,
            cpb as i32,
            dims.nblk as i32,
            dims.block as i32,
            dims.h as i32,
            dims.kv as i32,
            dims.d as i32,
        ];
        let cfg = LaunchConfig {
            grid_dim: (
                grid_dim(nchunk.div_ceil(cpb), "paged decode")?,
                dims.kv as u32,
                dims.b as u32,
            ),
            block_dim: (PIPE_THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        with_arrivals(dev, dims.b * dims.kv, |count| {
            let mut b = f.builder();
            b.arg(qv)
                .arg(kv)
                .arg(vv)
                .arg(tv)
                .arg(lv)
                .arg(&mut part)
                .arg(&mut o)
                .arg(&mut stats)
                .arg(count);
            for x in &ints {
                b.arg(x);
            }
            b.arg(&dims.scale);
            // SAFETY: the arguments match flash_decode_paged_* in kernels/flash_decode.cu, its
            // dynamic shared memory is launch.cuh's fdp_smem for (d, the pool's dtype), every
            // table entry a row reads names a block of the pool (model::paged builds them), and
            // `count` holds (B, KV) zeros.
            unsafe { b.launch(cfg) }.w()?;
            Ok(())
        })?;
    }
    Ok(o)
}

/// The pipelined decode's instance for `h / kv` query heads per KV head: those compiled for 2
/// (Qwen3-1.7B) or 4 (Qwen3-4B, 8B) hold only their heads in registers (in bf16 and FP8, 3
/// blocks an SM where the instance for any count up to [`PIPE_MAX_GROUP`] fits 2;
/// kernels/flash_decode.cu).
fn group_suffix(h: usize, kv: usize) -> &'static str {
    match h / kv {
        2 => "_g2",
        4 => "_g4",
        _ => "",
    }
}

thread_local! {
    /// The pipelined decode's arrival counters, one buffer a device and host thread: the last
    /// of a (row, KV head)'s blocks to finish merges the row's partials and sets its counter
    /// back to zero (kernels/common.cuh, `block_arrive_last`), so a buffer is zeroed once, when
    /// made or grown, and never cleared before a launch. A buffer must never serve two launches
    /// that can run at once: candle's device launches on the calling thread's per-thread
    /// stream (`CU_STREAM_PER_THREAD`), so two threads' launches on one device may overlap,
    /// while one thread's run in order. Hence a buffer per thread; a thread's buffers go with
    /// it.
    static ARRIVALS: RefCell<Vec<(DeviceId, CudaSlice<i32>)>> = const { RefCell::new(Vec::new()) };
}

/// `launch` with this thread's arrival counters for `dev`, at least `n` of them zero.
fn with_arrivals(
    dev: &CudaDevice,
    n: usize,
    launch: impl FnOnce(&mut CudaSlice<i32>) -> Result<()>,
) -> Result<()> {
    ARRIVALS.with(|all| {
        let mut all = all.borrow_mut();
        let at = match all.iter().position(|(id, _)| *id == dev.id()) {
            Some(at) => at,
            None => {
                all.push((dev.id(), dev.alloc_zeros::<i32>(n.max(1))?));
                all.len() - 1
            }
        };
        if all[at].1.len() < n {
            all[at].1 = dev.alloc_zeros::<i32>(n.next_power_of_two())?;
        }
        launch(&mut all[at].1)
    })
}

/// dQ, dK, dV (the storage dtype of q): δ = rowsum(dO ⊙ O) by the row kernel, then, where the
/// tensor-core kernels apply, dQ and dK/dV as `backward` says ([`FlashBackward`]), else the row
/// kernels' dQ and dK/dV.
#[allow(clippy::too_many_arguments)]
pub fn flash_bwd(
    dims: &FlashDims,
    backward: FlashBackward,
    q: Arg,
    k: Arg,
    v: Arg,
    o: Arg,
    dout: Arg,
    stats: Arg,
    (valid, first): (Arg, Option<Arg>),
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let what = "acpo-flash-attention-bwd";
    let dtype = dtype_of(q.0);
    let sfx = suffix(dtype, what)?;
    with_type!(dtype, T, {
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
        let mut own = None;
        let first = first_or_own(dims, valid, first, &mut own)?;
        let rows = dims.rows();
        let keys = dims.b * dims.kv * dims.s;
        let n = FlashInts::of(dims);
        // SAFETY: each kernel writes every row it owns.
        let mut delta = unsafe { dev.alloc::<f32>(rows.max(1)) }?;
        let mut dq = unsafe { dev.alloc::<T>(rows * dims.d) }?;
        let mut dk = unsafe { dev.alloc::<T>(keys * dims.d) }?;
        let mut dv = unsafe { dev.alloc::<T>(keys * dims.d) }?;
        if rows > 0 {
            let f = kernel!(dev, &format!("flash_delta_{sfx}"), ROW_PTX)?;
            let rows_i = rows as i32;
            let mut b = f.builder();
            b.arg(&ov).arg(&dov).arg(&mut delta).arg(&rows_i).arg(&n.d);
            // SAFETY: the arguments match flash_delta_* in kernels/flash_attn.cu.
            unsafe { b.launch(row_grid(rows, 1, 1)?) }.w()?;

            let mma = mma_dim(dims, dtype, &[q.1, k.1, v.1, o.1, dout.1]);
            let ins = BwdInputs {
                q: qv,
                k: kv,
                v: vv,
                dout: dov,
                stats: statsv,
                delta,
                valid: validv,
                first,
                n,
            };
            let out = (&mut dq, &mut dk, &mut dv);
            match (backward, mma) {
                (FlashBackward::FiveProducts, Some(d)) => five_products(dev, dims, d, &ins, out)?,
                (_, mma) => pair(dev, dims, sfx, mma, &ins, out)?,
            }
        }
        Ok((
            CudaStorage::wrap_cuda_slice(dq, dev.clone()),
            CudaStorage::wrap_cuda_slice(dk, dev.clone()),
            CudaStorage::wrap_cuda_slice(dv, dev.clone()),
        ))
    })
}

/// What every backward kernel takes: first q, k, v, dO, the statistics, δ, the valid keys and
/// each sequence's first valid key, in that order; last the shape arguments (`FA_ARGS`).
struct BwdInputs<'a, T> {
    q: CudaView<'a, T>,
    k: CudaView<'a, T>,
    v: CudaView<'a, T>,
    dout: CudaView<'a, T>,
    stats: CudaView<'a, f32>,
    delta: CudaSlice<f32>,
    valid: CudaView<'a, u8>,
    first: CudaView<'a, u32>,
    n: FlashInts,
}

impl<T> BwdInputs<'_, T> {
    /// The inputs, before a kernel's outputs.
    fn push<'b>(&'b self, b: &mut LaunchArgs<'b>) {
        b.arg(&self.q)
            .arg(&self.k)
            .arg(&self.v)
            .arg(&self.dout)
            .arg(&self.stats)
            .arg(&self.delta)
            .arg(&self.valid)
            .arg(&self.first);
    }
}

/// dQ, dK and dV, the buffers a backward writes.
type BwdOutputs<'o, T> = (
    &'o mut CudaSlice<T>,
    &'o mut CudaSlice<T>,
    &'o mut CudaSlice<T>,
);

/// The backward in 5 products on tensor cores at head dim `d`: dK/dV by key blocks, each adding
/// its share of dQ to f32 sums in key-block order (`flash_dkdvq_*`), then dQ = scale · sums
/// (`flash_dq_acc_bf16`).
fn five_products<T>(
    dev: &CudaDevice,
    dims: &FlashDims,
    d: usize,
    ins: &BwdInputs<T>,
    (dq, dk, dv): BwdOutputs<T>,
) -> Result<()> {
    // dQ's f32 sums, and a counter per (sequence, query head, query tile) then the blocks'
    // ticket, all zeroed: the kernel adds to the sums in key-block order.
    let elems = dims.rows() * d;
    let elems_i = i32::try_from(elems).map_err(|_| {
        candle_core::Error::Msg(format!(
            "acpo-flash-attention-bwd: dQ's {elems} elements in one launch"
        ))
    })?;
    let mut sums = dev.alloc_zeros::<f32>(elems)?;
    let tiles = dims.b * dims.h * dims.t.div_ceil(MMA_TILE);
    let mut counts = dev.alloc_zeros::<i32>(tiles + 1)?;
    let l = mma_dkdvq(d);
    let f = kernel!(dev, &format!("flash_dkdvq_mma_d{d}_bf16"), MMA_PTX)?;
    allow_smem(&f, l.smem, "flash attention")?;
    let mut b = f.builder();
    ins.push(&mut b);
    b.arg(dk).arg(dv).arg(&mut sums).arg(&mut counts);
    ins.n.push(&mut b);
    // SAFETY: the arguments match flash_dkdvq_mma_* in kernels/flash_mma.cu; the counters and
    // the ticket are zero, as its waits need.
    unsafe { b.launch(mma_grid(dims.s, dims.kv, dims.b, l)?) }.w()?;

    let f = kernel!(dev, "flash_dq_acc_bf16", MMA_PTX)?;
    let mut b = f.builder();
    b.arg(&sums).arg(dq).arg(&elems_i).arg(&ins.n.scale);
    // SAFETY: the arguments match flash_dq_acc_bf16 (a grid-stride loop over elems).
    unsafe { b.launch(elems_config(elems)) }.w()?;
    Ok(())
}

/// The backward's pair of kernels: dQ by query tiles, then dK/dV by key blocks, on tensor cores
/// at head dim `mma` where it is `Some`, else the row kernels of suffix `sfx`.
fn pair<T>(
    dev: &CudaDevice,
    dims: &FlashDims,
    sfx: &str,
    mma: Option<usize>,
    ins: &BwdInputs<T>,
    (dq, dk, dv): BwdOutputs<T>,
) -> Result<()> {
    let (f, cfg) = pick!(dev, "flash_dq", sfx, mma, mma_dq, (dims.t, dims.h, dims.b),);
    let mut b = f.builder();
    ins.push(&mut b);
    b.arg(dq);
    ins.n.push(&mut b);
    // SAFETY: the arguments match flash_dq_* and flash_dq_mma_* (the same list).
    unsafe { b.launch(cfg) }.w()?;

    let (f, cfg) = pick!(
        dev,
        "flash_dkdv",
        sfx,
        mma,
        mma_dkdv,
        (dims.s, dims.kv, dims.b),
    );
    let mut b = f.builder();
    ins.push(&mut b);
    b.arg(dk).arg(dv);
    ins.n.push(&mut b);
    // SAFETY: the arguments match flash_dkdv_* and flash_dkdv_mma_* (the same list).
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}
