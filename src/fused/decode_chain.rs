//! The decode step's per-layer element-wise chain in two kernels (kernels/decode_chain.cu), for
//! a sampling model on CUDA (one query position per row, no autograd graph):
//!
//! - [`qk_norm_rope_cache`]: from the q/k/v projection as one product with the stacked weights
//!   `[Wq; Wk; Wv]`, Qwen3's RMSNorm of every q and k head (Qwen2: none), the rotary embedding of
//!   both, q returned heads first, and the new token's k and v written into the KV cache
//!   ([`KvWrite`]: a dense cache's column, or the pool rows a paged step names): one launch for
//!   the six of the composed chain ([`qk_norm_rope_cache_composed`]: two norms, two rotations,
//!   two writes), after one product for three.
//! - [`add_rms_norm`]: the residual add and the RMSNorm that follows it, both results returned:
//!   one launch for two ([`add_rms_norm_composed`]).
//!
//! - [`store_rows`]: whole rows into the pool rows a paged cache's write index names (a
//!   prefill's keys and values, a shared block's copy), one thread a word on CUDA, where
//!   candle's `scatter_set` walks the rows one after another; `scatter_set` itself elsewhere.
//!
//! The first two return `None` where their kernel does not apply (the CPU, another dtype, a shape the
//! kernel does not take): the caller then runs the composed twin, which is also the kernel's
//! oracle (tests/it/cuda.rs). The CPU never takes the fused path, so no CPU result changes.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

/// Qwen3's q and k norms (their weights `(D)`) and ε.
#[derive(Clone, Copy)]
pub struct QkNorms<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub eps: f64,
}

/// Where a decode step's new keys and values go.
#[derive(Clone, Copy, Debug)]
pub enum KvWrite<'a> {
    /// Column `col` of the dense cache's buffers `(B, KV, capacity, D)`.
    Column(usize),
    /// The pool rows of a paged cache, whose buffers are `(N, D)`: row `b · KV + j` of this
    /// write index `(B · KV, W)` (u32, [`crate::model::paged::PagedKv::write_index`]: the row
    /// repeated across its W columns; the first is read) names where head j of row b goes.
    PoolRows(&'a Tensor),
}

/// The largest head dim the fused kernel takes (its shared row, `DEC_MAXD`).
#[cfg(feature = "cuda")]
const MAX_HEAD_DIM: usize = crate::fused::launch::sizes::DEC_MAXD as usize;

/// The composed chain the fused kernel replaces, as the model runs it: q and k `(B, 1, H, D)`
/// and `(B, 1, KV, D)` normalised (when `norms`) and rotated by `cos`, `sin` `(B, 1, 1, D)`
/// into heads first; k and v `(B, 1, KV, D)` written where `at` says in the cache buffers (in
/// their dtype, or as E4M3 bytes into `U8` buffers: an FP8 cache). Returns q `(B, H, 1, D)`.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope_cache_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    norms: Option<QkNorms>,
    cos: &Tensor,
    sin: &Tensor,
    (k_cache, v_cache): (&Tensor, &Tensor),
    at: KvWrite,
) -> Result<Tensor> {
    let (q, k) = match norms {
        Some(n) => (
            super::rms_norm(q, n.q, n.eps)?,
            super::rms_norm(k, n.k, n.eps)?,
        ),
        None => (q.clone(), k.clone()),
    };
    let q = super::rope_heads(&q, cos, sin)?;
    let k = super::rope_heads(&k, cos, sin)?;
    let v = v.transpose(1, 2)?.contiguous()?;
    // an FP8 cache (E4M3 bytes) holds each new key and value rounded to its byte
    let (k, v) = if k_cache.dtype() == DType::U8 {
        (super::to_fp8_bytes(&k)?, super::to_fp8_bytes(&v)?)
    } else {
        (k, v)
    };
    match at {
        KvWrite::Column(col) => {
            k_cache.slice_set(&k, 2, col)?;
            v_cache.slice_set(&v, 2, col)?;
        }
        KvWrite::PoolRows(index) => {
            let (rows, d) = (index.dim(0)?, k.dim(3)?);
            let full = index
                .narrow(1, 0, 1)?
                .broadcast_as((rows, d))?
                .contiguous()?;
            store_rows(k_cache, &full, &k.reshape((rows, d))?)?;
            store_rows(v_cache, &full, &v.reshape((rows, d))?)?;
        }
    }
    Ok(q)
}

/// Writes the rows of `src` `(n, D)` to the rows of `pool` `(N, D)` that `index` names: row i
/// to `index[i, 0]`, the write index of a paged cache (`PagedKv::write_index`: `(n, D)` u32,
/// each row's destination repeated across the head dim, `Tensor::scatter_set`'s shape).
/// `scatter_set` does exactly this, and does it on the CPU (the same bits as ever); on CUDA it
/// walks the rows one after another in one block of D threads, so where the kernel takes the
/// operands (contiguous, `src` in the pool's dtype: f32, bf16, f16 or an FP8 cache's bytes, rows a
/// whole number of 4-byte words) one launch copies them a word a thread
/// (kernels/decode_chain.cu, `pool_store_*`; an index past the pool stops it). Where rows name
/// one pool row (padding, all sent to the scratch row) which one lands is not fixed there;
/// nothing on the GPU reads that row.
pub fn store_rows(pool: &Tensor, index: &Tensor, src: &Tensor) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Some(word) = cuda::store_word(pool, index, src)? {
        if src.dim(0)? > 0 {
            pool.inplace_op3(src, index, &StoreRows { word })?;
            counted(&STORE_LAUNCHES);
        }
        return Ok(());
    }
    pool.scatter_set(index, src, 0)
}

/// [`store_rows`]'s kernel as an in-place op on the pool (the source rows and the index its
/// operands), in words of `word` bytes.
#[cfg(feature = "cuda")]
struct StoreRows {
    word: usize,
}

#[cfg(feature = "cuda")]
impl candle_core::InplaceOp3 for StoreRows {
    fn name(&self) -> &'static str {
        "acpo-pool-store"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        candle_core::bail!("{}: the CPU stores with scatter_set", self.name())
    }

    fn cuda_fwd(
        &self,
        pool: &mut candle_core::CudaStorage,
        lp: &Layout,
        src: &candle_core::CudaStorage,
        ls: &Layout,
        index: &candle_core::CudaStorage,
        li: &Layout,
    ) -> Result<()> {
        cuda::store_rows((pool, lp), (src, ls), (index, li), self.word)
    }
}

/// Whether [`qk_norm_rope_cache`] can run for a model on `device` in `dtype` with heads of
/// `head_dim`: CUDA, f32 or bf16, an even head dim up to `DEC_MAXD`.
pub fn qk_chain_applies(
    device: &candle_core::Device,
    dtype: candle_core::DType,
    head_dim: usize,
) -> bool {
    #[cfg(feature = "cuda")]
    {
        device.is_cuda()
            && matches!(dtype, candle_core::DType::F32 | candle_core::DType::BF16)
            && head_dim.is_multiple_of(2)
            && head_dim <= MAX_HEAD_DIM
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, dtype, head_dim);
        false
    }
}

/// [`qk_norm_rope_cache_composed`] in one launch from `qkv` `(B, 1, (H + 2·KV)·D)`, a row's q
/// heads, then its k heads, then its v heads (the product with the stacked weights
/// `[Wq; Wk; Wv]`), `heads` = (H, KV), where the kernel applies ([`qk_chain_applies`], one
/// position per row, a dense cache with room at the column, or a pool with a write index of
/// the batch's rows). None elsewhere (nothing written).
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope_cache(
    qkv: &Tensor,
    heads: (usize, usize),
    norms: Option<QkNorms>,
    cos: &Tensor,
    sin: &Tensor,
    (k_cache, v_cache): (&Tensor, &Tensor),
    at: KvWrite,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    {
        let Some(dims) = chain_dims(qkv, heads, norms, cos, sin, (k_cache, v_cache), at)? else {
            return Ok(None);
        };
        let (qw, kw) = match norms {
            Some(n) => (n.q.contiguous()?, n.k.contiguous()?),
            // not read without norms: any tensor of the dtype
            None => (cos.clone(), cos.clone()),
        };
        let op = QkChain {
            dims,
            qw,
            kw,
            cos: cos.contiguous()?,
            sin: sin.contiguous()?,
            k_cache: k_cache.clone(),
            v_cache: v_cache.clone(),
            eps: norms.map_or(0.0, |n| n.eps as f32),
            norm: norms.is_some(),
            at,
        };
        let out = qkv.contiguous()?.apply_op1_no_bwd(&op)?;
        counted(&QK_LAUNCHES);
        Ok(Some(out))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (qkv, heads, norms, cos, sin, k_cache, v_cache, at);
        Ok(None)
    }
}

/// The kernel's sizes where it takes these operands, else None.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn chain_dims(
    qkv: &Tensor,
    (h, kv): (usize, usize),
    norms: Option<QkNorms>,
    cos: &Tensor,
    sin: &Tensor,
    (k_cache, v_cache): (&Tensor, &Tensor),
    at: KvWrite,
) -> Result<Option<ChainDims>> {
    let dtype = qkv.dtype();
    let mut all = vec![qkv, cos, sin];
    if let Some(n) = norms {
        all.extend([n.q, n.k]);
    }
    // the caches in the model's dtype, or E4M3 bytes under bf16 (`*_bf16_fp8`)
    let cache_dtype = k_cache.dtype();
    let caches_fit = (cache_dtype == dtype || (cache_dtype == DType::U8 && dtype == DType::BF16))
        && v_cache.dtype() == cache_dtype
        && [k_cache, v_cache]
            .iter()
            .all(|t| t.device().same_device(qkv.device()));
    if all
        .iter()
        .any(|t| t.dtype() != dtype || !t.device().same_device(qkv.device()))
        || !caches_fit
        || qkv.rank() != 3
        || !k_cache.is_contiguous()
        || !v_cache.is_contiguous()
        || v_cache.dims() != k_cache.dims()
        || h == 0
        || kv == 0
    {
        return Ok(None);
    }
    let (b, t, width) = qkv.dims3()?;
    let d = width / (h + 2 * kv);
    let fits = qk_chain_applies(qkv.device(), dtype, d)
        && t == 1
        && width == (h + 2 * kv) * d
        && cos.dims() == [b, 1, 1, d]
        && sin.dims() == cos.dims()
        && norms.is_none_or(|n| n.q.dims() == [d] && n.k.dims() == [d]);
    // where the new rows go: a column of the row's buffers with room, or one pool row each
    let slots = match at {
        KvWrite::Column(col) => match k_cache.dims() {
            &[cb, ckv, cap, cd] => ((cb, ckv, cd) == (b, kv, d) && col < cap).then_some(cap),
            _ => None,
        },
        KvWrite::PoolRows(index) => match (k_cache.dims(), index.dims()) {
            (&[n, cd], &[rows, cols]) => (cd == d
                && rows == b * kv
                && cols > 0
                && index.dtype() == candle_core::DType::U32
                && index.is_contiguous()
                && index.device().same_device(qkv.device()))
            .then_some(n),
            _ => None,
        },
    };
    Ok(match slots {
        Some(slots) if fits => Some(ChainDims { b, h, kv, d, slots }),
        _ => None,
    })
}

#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
struct ChainDims {
    b: usize,
    h: usize,
    kv: usize,
    d: usize,
    /// The dense cache's capacity, or the pool's rows.
    slots: usize,
}

/// The fused chain as a custom op on the q/k/v product; the cache buffers it writes and the
/// tables it reads are held here.
#[cfg(feature = "cuda")]
struct QkChain<'a> {
    dims: ChainDims,
    qw: Tensor,
    kw: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    eps: f32,
    norm: bool,
    at: KvWrite<'a>,
}

#[cfg(feature = "cuda")]
impl candle_core::CustomOp1 for QkChain<'_> {
    fn name(&self) -> &'static str {
        "acpo-qk-norm-rope-cache"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("{}: the CPU runs the composed chain", self.name())
    }

    fn cuda_fwd(
        &self,
        qkv: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let held = [
            &self.qw,
            &self.kw,
            &self.cos,
            &self.sin,
            &self.k_cache,
            &self.v_cache,
        ];
        let guards: Vec<_> = held.iter().map(|t| t.storage_and_layout()).collect();
        let mut stores = Vec::with_capacity(held.len());
        for (s, l) in &guards {
            match &**s {
                candle_core::Storage::Cuda(c) => stores.push((c, *l)),
                _ => candle_core::bail!("{}: operands on different devices", self.name()),
            }
        }
        let index_guard;
        let at = match self.at {
            KvWrite::Column(col) => cuda::At::Column(col),
            KvWrite::PoolRows(index) => {
                index_guard = index.storage_and_layout();
                match &*index_guard.0 {
                    candle_core::Storage::Cuda(c) => cuda::At::PoolRows(c, index_guard.1),
                    _ => candle_core::bail!("{}: operands on different devices", self.name()),
                }
            }
        };
        let d = &self.dims;
        let out = cuda::qk_chain(
            (qkv, l),
            [stores[0], stores[1], stores[2], stores[3]],
            [stores[4], stores[5]],
            (d.h, d.kv, d.d, d.slots),
            (self.eps, self.norm, at),
        )?;
        Ok((out, Shape::from((d.b, d.h, 1, d.d))))
    }
}

/// The residual add and the RMSNorm after it: `(x + a, rms_norm(x + a)·w)`, as the model
/// composes them.
pub fn add_rms_norm_composed(
    x: &Tensor,
    a: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let h = (x + a)?;
    let y = super::rms_norm(&h, w, eps)?;
    Ok((h, y))
}

/// [`add_rms_norm_composed`] in one launch where the kernel applies (CUDA, f32 or bf16, `x` and
/// `a` of one shape whose last dim is `w`'s); None elsewhere. No backward: for a model
/// without a graph.
pub fn add_rms_norm(
    x: &Tensor,
    a: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<Option<(Tensor, Tensor)>> {
    let dtype = x.dtype();
    let applies = cfg!(feature = "cuda")
        && x.device().is_cuda()
        && matches!(dtype, candle_core::DType::F32 | candle_core::DType::BF16)
        && a.dtype() == dtype
        && w.dtype() == dtype
        && x.dims() == a.dims()
        && w.rank() == 1
        && x.dims().last() == Some(&w.dim(0)?);
    if !applies {
        return Ok(None);
    }
    let both = x.contiguous()?.apply_op3_no_bwd(
        &a.contiguous()?,
        &w.contiguous()?,
        &AddRmsNorm { eps: eps as f32 },
    )?;
    counted(&ADD_NORM_LAUNCHES);
    Ok(Some((both.get(0)?, both.get(1)?)))
}

thread_local! {
    static QK_LAUNCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static ADD_NORM_LAUNCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static STORE_LAUNCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The [`store_rows`] kernels this thread has launched: so a test can tell the pool's stores
/// took the kernel rather than `scatter_set`, which writes the same rows.
pub fn pool_store_launches() -> usize {
    STORE_LAUNCHES.with(std::cell::Cell::get)
}

type Counter = std::thread::LocalKey<std::cell::Cell<usize>>;

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn counted(counter: &'static Counter) {
    counter.with(|n| n.set(n.get() + 1));
}

/// How many of each fused decode-chain kernel this thread has launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainLaunches {
    /// [`qk_norm_rope_cache`]: one a layer of a fused decode step.
    pub qk: usize,
    /// [`add_rms_norm`]: two a layer.
    pub add_norm: usize,
}

/// The fused decode-chain kernels this thread has launched, each kind on its own: so a test
/// can tell the fused path ran rather than the composed fallback that gives the same numbers.
pub fn decode_chain_launches() -> ChainLaunches {
    ChainLaunches {
        qk: QK_LAUNCHES.with(std::cell::Cell::get),
        add_norm: ADD_NORM_LAUNCHES.with(std::cell::Cell::get),
    }
}

/// `[x + a; rms_norm(x + a)·w]` stacked on a new first dim (a custom op has one output).
struct AddRmsNorm {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    eps: f32,
}

impl CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "acpo-add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("{}: the CPU runs the composed add and norm", self.name())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        a: &candle_core::CudaStorage,
        la: &Layout,
        w: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = cuda::add_rms_norm((x, lx), (a, la), (w, lw), self.eps)?;
        let mut dims = vec![2];
        dims.extend_from_slice(lx.dims());
        Ok((out, Shape::from(dims)))
    }
}

/// The CUDA launches of `kernels/decode_chain.cu`; the CPU twins are this file's `*_composed`.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, DType, Layout, Result};

    use candle_core::Tensor;

    use crate::fused::launch::{
        dtype_of, elems_config, grid_dim, kernel, ptx, rows_config, sizes, suffix, view, with_type,
    };

    const PTX: (&str, &str) = ptx!("decode_chain");

    type Arg<'a> = (&'a CudaStorage, &'a Layout);

    /// Where the kernel writes the new keys and values ([`super::KvWrite`], its index on the
    /// device).
    pub enum At<'a> {
        Column(usize),
        PoolRows(&'a CudaStorage, &'a Layout),
    }

    /// q heads first `(B, H, 1, D)` from q, k, v; k and v into the caches where `at` says
    /// (`slots`: the dense cache's capacity or the pool's rows).
    pub fn qk_chain(
        (qkv, lqkv): Arg,
        [(qw, lqw), (kw, lkw), (cos, lc), (sin, ls)]: [Arg; 4],
        [(kc, lkc), (vc, lvc)]: [Arg; 2],
        (h, kv, d, slots): (usize, usize, usize, usize),
        (eps, norm, at): (f32, bool, At),
    ) -> Result<CudaStorage> {
        let what = "acpo-qk-norm-rope-cache";
        let sfx = suffix(dtype_of(qkv), what)?;
        with_type!(dtype_of(qkv), T, {
            let dev = &qkv.device;
            let qkvv = view::<T>(qkv, lqkv, what)?;
            let (qwv, kwv, cv, sv) = (
                view::<T>(qw, lqw, what)?,
                view::<T>(kw, lkw, what)?,
                view::<T>(cos, lc, what)?,
                view::<T>(sin, ls, what)?,
            );
            // The cache buffers are written in place, as `slice_set` or `scatter_set` writes
            // them: their storage is shared by the cache's tensors, and this stream's kernels
            // run in order. An FP8 cache's are E4M3 bytes (`*_bf16_fp8`).
            let fp8 = dtype_of(kc) == DType::U8;
            let (same, bytes) = if fp8 {
                let v8 = |s, l| view::<u8>(s, l, what);
                (None, Some((v8(kc, lkc)?, v8(vc, lvc)?)))
            } else {
                (
                    Some((view::<T>(kc, lkc, what)?, view::<T>(vc, lvc, what)?)),
                    None,
                )
            };
            let rows = qkvv.len() / ((h + 2 * kv) * d).max(1);
            // SAFETY: every element of q's output is written (each (row, q head) block its row).
            let mut out = unsafe { dev.alloc::<T>(rows * h * d) }?;
            let (h_i, kv_i, d_i, norm_i) = (h as i32, kv as i32, d as i32, i32::from(norm));
            let index = match &at {
                At::PoolRows(s, l) => Some((view::<u32>(s, l, what)?, l.dims()[1])),
                At::Column(_) => None,
            };
            let name = match at {
                At::Column(_) => "qk_norm_rope_cache",
                At::PoolRows(..) => "qk_norm_rope_paged",
            };
            let kv_sfx = if fp8 { "_fp8" } else { "" };
            let f = kernel!(dev, &format!("{name}_{sfx}{kv_sfx}"), PTX)?;
            let mut b = f.builder();
            b.arg(&qkvv)
                .arg(&qwv)
                .arg(&kwv)
                .arg(&cv)
                .arg(&sv)
                .arg(&mut out);
            if let Some((kcv, vcv)) = &same {
                b.arg(kcv).arg(vcv);
            } else if let Some((kcv, vcv)) = &bytes {
                b.arg(kcv).arg(vcv);
            }
            b.arg(&h_i).arg(&kv_i).arg(&d_i).arg(&eps).arg(&norm_i);
            let (row_stride, head_stride, col) = match at {
                At::Column(col) => (kv * slots * d, slots * d, col),
                At::PoolRows(..) => (0, 0, 0),
            };
            match &index {
                // the index's row stride (its width) and the pool's rows, which the kernel
                // holds every index below
                Some((rows_v, width)) => b.arg(rows_v).arg(width).arg(&slots),
                None => b.arg(&row_stride).arg(&head_stride).arg(&col),
            };
            let cfg = LaunchConfig {
                grid_dim: (grid_dim(rows * (h + 2 * kv), what)?, 1, 1),
                block_dim: (sizes::DEC_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            if rows > 0 {
                // SAFETY: the arguments match qk_norm_rope_cache_* or qk_norm_rope_paged_* in
                // kernels/decode_chain.cu; the caller checked the shapes (chain_dims), so every
                // write is in its buffer (the paged kernel traps on an index past the pool).
                unsafe { b.launch(cfg) }.w()?;
            }
            Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
        })
    }

    /// The word [`super::store_rows`]'s kernel copies `src` `(n, D)` into `pool` `(N, D)` by,
    /// through `index` `(n, W)` (u32): 16 bytes where a row and both starts are whole 16-byte
    /// words, else 4 where they are whole 4-byte words; None where the kernel does not take
    /// the operands (not CUDA, another device or dtype, a shape or layout it does not read).
    pub fn store_word(pool: &Tensor, index: &Tensor, src: &Tensor) -> Result<Option<usize>> {
        let same = |t: &Tensor| t.device().same_device(pool.device()) && t.is_contiguous();
        let (dims, src_dims, index_dims) = (pool.dims(), src.dims(), index.dims());
        let fits = pool.device().is_cuda()
            && same(src)
            && same(index)
            && pool.is_contiguous()
            && matches!(
                pool.dtype(),
                DType::F32 | DType::BF16 | DType::F16 | DType::U8
            )
            && src.dtype() == pool.dtype()
            && index.dtype() == DType::U32
            && dims.len() == 2
            && src_dims.len() == 2
            && index_dims.len() == 2
            && src_dims[1] == dims[1]
            && index_dims[0] == src_dims[0]
            && index_dims[1] > 0;
        if !fits {
            return Ok(None);
        }
        let elem = pool.dtype().size_in_bytes();
        let row = dims[1] * elem;
        let starts = [
            pool.layout().start_offset() * elem,
            src.layout().start_offset() * elem,
        ];
        Ok([16, 4].into_iter().find(|w| {
            row > 0 && row.is_multiple_of(*w) && starts.iter().all(|s| s.is_multiple_of(*w))
        }))
    }

    /// `pool_store_w{4,16}` (kernels/decode_chain.cu): row i of `src` to pool row
    /// `index[i, 0]`, in words of `word` bytes; the pool's rows are checked on the device.
    pub fn store_rows(
        (pool, lp): (&mut CudaStorage, &Layout),
        (src, ls): Arg,
        (index, li): Arg,
        word: usize,
    ) -> Result<()> {
        let what = "acpo-pool-store";
        let dev = pool.device.clone();
        let (n_pool, width) = lp.shape().dims2()?;
        let (n, _) = ls.shape().dims2()?;
        let rows_stride = li.shape().dims2()?.1;
        let elem = dtype_of(pool).size_in_bytes();
        let words = width * elem / word;
        let iv = view::<u32>(index, li, what)?;
        let (a, b) = lp
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg(format!("{what}: pool must be contiguous")))?;
        let name = format!("pool_store_w{word}");
        let f = kernel!(dev, &name, PTX)?;
        // Bytes are bytes: each dtype's storage passed as the kernel's words (a pointer either
        // way; `store_word` checked that rows and starts are whole words).
        macro_rules! launch {
            ($t:ty) => {{
                let sv = view::<$t>(src, ls, what)?;
                let mut pv = pool.as_cuda_slice_mut::<$t>()?.slice_mut(a..b);
                let mut builder = f.builder();
                builder
                    .arg(&sv)
                    .arg(&mut pv)
                    .arg(&iv)
                    .arg(&rows_stride)
                    .arg(&n)
                    .arg(&words)
                    .arg(&n_pool);
                // SAFETY: the arguments match pool_store_* in kernels/decode_chain.cu: n rows of
                // `words` words in src, n_pool in the pool, each index checked on the device.
                unsafe { builder.launch(elems_config(n * words)) }.w()?;
            }};
        }
        match dtype_of(pool) {
            DType::F32 => launch!(f32),
            DType::BF16 => launch!(half::bf16),
            DType::F16 => launch!(half::f16),
            DType::U8 => launch!(u8),
            other => candle_core::bail!("{what}: no kernel for a pool of {other:?}"),
        }
        Ok(())
    }

    /// `[x + a; rms_norm(x + a)·w]` stacked.
    pub fn add_rms_norm((x, lx): Arg, (a, la): Arg, (w, lw): Arg, eps: f32) -> Result<CudaStorage> {
        let what = "acpo-add-rms-norm";
        let sfx = suffix(dtype_of(x), what)?;
        with_type!(dtype_of(x), T, {
            let dev = &x.device;
            let (xv, av, wv) = (
                view::<T>(x, lx, what)?,
                view::<T>(a, la, what)?,
                view::<T>(w, lw, what)?,
            );
            let n = wv.len();
            let len = xv.len();
            let rows = len / n.max(1);
            // SAFETY: both halves are written whole (each row's block covers its row of each).
            let mut out = unsafe { dev.alloc::<T>(2 * len) }?;
            let f = kernel!(dev, &format!("add_rms_norm_{sfx}"), PTX)?;
            let n_i = n as i32;
            {
                let (mut hs, mut y) = out.split_at_mut(len);
                let mut b = f.builder();
                b.arg(&xv)
                    .arg(&av)
                    .arg(&wv)
                    .arg(&mut hs)
                    .arg(&mut y)
                    .arg(&n_i)
                    .arg(&eps);
                if rows > 0 {
                    // SAFETY: the arguments match add_rms_norm_* in kernels/decode_chain.cu.
                    unsafe { b.launch(rows_config(rows)?) }.w()?;
                }
            }
            Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
        })
    }
}
