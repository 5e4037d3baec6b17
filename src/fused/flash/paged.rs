//! Decode attention through a paged KV cache's block tables (`model::paged`): one query
//! position a row, each row's keys its first `lens[b]` positions, position j in block
//! `tables[b][j / block]`, row `j % block`, and the query (the row's last position) sees them
//! all. The CPU twin here computes each row exactly as the parent module's twin does (all
//! scores, max, exp, sum); on CUDA `kernels/flash_decode.cu`'s `flash_decode_paged_*` reads
//! the pool in place ([`super::cuda`]), with the bits the dense decode kernel gives the same
//! keys (kernels/check/flash_check.cu).

use std::borrow::Cow;

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

use super::super::{exp_shifted_in_place, row_max, slice_f32};
use super::{dot, map_rows, PagedDims, FLASH_MAX_HEAD_DIM};

/// Whether [`paged_attention_decode`] runs on `device` in `dtype` without gathering: the CPU
/// twin (an f32 query over f32 or E4M3 pools), or CUDA's kernel (f32 or bf16, head dim 64 or
/// 128, at most 8 query heads per KV head; E4M3 pools under bf16).
pub fn paged_applies(device: &Device, dtype: DType, head_dim: usize, groups: usize) -> bool {
    if device.is_cpu() {
        return dtype == DType::F32 && head_dim <= FLASH_MAX_HEAD_DIM;
    }
    cfg!(feature = "cuda")
        && device.is_cuda()
        && matches!(dtype, DType::F32 | DType::BF16)
        && matches!(head_dim, 64 | 128)
        && (1..=8).contains(&groups)
}

/// Each row's key count, `(B)` u32 on the device the kernel reads, and the same values on the
/// host, where the launch's checks and its grid need them: made once a decode step, so the
/// layers never copy them back from the device (a wait for the GPU in every layer).
#[derive(Debug, Clone)]
pub struct RowLens {
    device: Tensor,
    host: Vec<u32>,
}

impl RowLens {
    pub fn new(host: Vec<u32>, device: &candle_core::Device) -> Result<RowLens> {
        Ok(RowLens {
            device: Tensor::from_vec(host.clone(), host.len(), device)?,
            host,
        })
    }
}

/// softmax(q·kᵀ·scale)·v `(B, H, 1, D)` over each row's keys read through its block table:
/// `q` `(B, H, 1, D)`, `k_pool`, `v_pool` `(blocks, KV, block, D)` (in q's dtype, or E4M3
/// bytes, `U8`: an FP8 cache), `tables` `(B, nblk)` u32, `lens` `(B)` (at least 1, at most
/// nblk · block; every table entry a row reads below `blocks`: checked here on the CPU, by the
/// table's maker on CUDA).
pub fn paged_attention_decode(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    tables: &Tensor,
    lens: &RowLens,
    scale: f64,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (blocks, kv, block, kd) = k_pool.dims4()?;
    let (tb, nblk) = tables.dims2()?;
    if t != 1
        || kd != d
        || v_pool.dims() != k_pool.dims()
        || kv == 0
        || h % kv != 0
        || tb != b
        || lens.device.dims() != [b]
        || lens.host.len() != b
        || tables.dtype() != DType::U32
    {
        candle_core::bail!(
            "paged attention: q {:?}, pools {:?}, tables {:?} and lens {:?} do not fit together",
            q.dims(),
            k_pool.dims(),
            tables.dims(),
            lens.device.dims()
        );
    }
    let host_lens = &lens.host;
    let longest = host_lens.iter().copied().max().unwrap_or(0) as usize;
    if host_lens
        .iter()
        .any(|&l| l == 0 || l as usize > nblk * block)
    {
        candle_core::bail!(
            "paged attention: row lengths {host_lens:?} for tables of {nblk} blocks of {block}"
        );
    }
    let dims = PagedDims {
        b,
        h,
        kv,
        d,
        blocks,
        block,
        nblk,
        longest,
        scale: scale as f32,
    };
    let op = PagedDecode {
        dims,
        tables: tables.contiguous()?,
        lens: lens.device.contiguous()?,
    };
    q.contiguous()?
        .apply_op3(&k_pool.contiguous()?, &v_pool.contiguous()?, op)
}

struct PagedDecode {
    dims: PagedDims,
    tables: Tensor,
    lens: Tensor,
}

/// The CPU twin: O `(B·H·D)`.
pub(crate) fn cpu_paged(
    dims: &PagedDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    tables: &[u32],
    lens: &[u32],
) -> Result<Vec<f32>> {
    let (d, rep) = (dims.d, dims.h / dims.kv);
    // The pool row of position j of batch row bi, head g (tables checked below).
    let at = |bi: usize, g: usize, j: usize| {
        let blk = tables[bi * dims.nblk + j / dims.block] as usize;
        ((blk * dims.kv + g) * dims.block + j % dims.block) * d
    };
    for (bi, &len) in lens.iter().enumerate() {
        let used = &tables[bi * dims.nblk..bi * dims.nblk + (len as usize).div_ceil(dims.block)];
        if let Some(bad) = used.iter().find(|&&x| x as usize >= dims.blocks) {
            candle_core::bail!(
                "paged attention: row {bi} names block {bad} of a pool of {}",
                dims.blocks
            );
        }
    }
    let rows = dims.b * dims.h;
    let rows_out = map_rows(rows, rows * dims.longest * d, |r| {
        let (bi, g) = (r / dims.h, (r % dims.h) / rep);
        let qr = &q[r * d..(r + 1) * d];
        let len = lens[bi] as usize;
        let mut p: Vec<f32> = (0..len)
            .map(|j| dot(qr, &k[at(bi, g, j)..at(bi, g, j) + d]) * dims.scale)
            .collect();
        let m = row_max(&p);
        let sum = exp_shifted_in_place(&mut p, m);
        let mut o = vec![0f32; d];
        for (j, &pj) in p.iter().enumerate() {
            let w = pj / sum;
            for (o, &x) in o.iter_mut().zip(&v[at(bi, g, j)..at(bi, g, j) + d]) {
                *o += w * x;
            }
        }
        o
    });
    Ok(rows_out.concat())
}

/// A CPU pool's numbers: f32 as they are, E4M3 bytes (`U8`, an FP8 cache) as their exact
/// values, as the kernel's `*_fp8` instance reads them.
fn pool_f32<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<Cow<'a, [f32]>> {
    let CpuStorage::U8(bytes) = s else {
        return Ok(Cow::Borrowed(slice_f32(s, l, what)?));
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: input must be contiguous");
    };
    Ok(Cow::Owned(super::super::fp8::fp8_values(&bytes[a..b])))
}

impl CustomOp3 for PagedDecode {
    fn name(&self) -> &'static str {
        "acpo-paged-decode"
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
        let q = slice_f32(s1, l1, self.name())?;
        let (k, v) = (
            pool_f32(s2, l2, self.name())?,
            pool_f32(s3, l3, self.name())?,
        );
        let tables = self.tables.flatten_all()?.to_vec1::<u32>()?;
        let lens = self.lens.to_vec1::<u32>()?;
        let o = cpu_paged(&self.dims, q, &k, &v, &tables, &lens)?;
        Ok((CpuStorage::F32(o), l1.shape().clone()))
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
        use candle_core::Storage;
        let (tables, lt) = self.tables.storage_and_layout();
        let (lens, ll) = self.lens.storage_and_layout();
        let (Storage::Cuda(tables), Storage::Cuda(lens)) = (&*tables, &*lens) else {
            candle_core::bail!("{}: the block tables are not on the GPU", self.name());
        };
        let o = super::cuda::paged_decode(
            &self.dims,
            (s1, l1),
            (s2, l2),
            (s3, l3),
            (tables, lt),
            (lens, ll),
        )?;
        Ok((o, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The twin through shuffled blocks equals the parent twin (`flash_attention`, the model's
    /// flash path) on each row's keys alone, bit for bit: both sum the same scores in the same
    /// order.
    #[test]
    fn the_paged_twin_is_the_dense_twin_on_the_same_keys() {
        let (b, h, kv, d, block) = (3usize, 4usize, 2usize, 8usize, 32usize);
        let lens = [5usize, 40, 70];
        let s = 70;
        let mut x = 1u64;
        let mut rnd = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let q: Vec<f32> = (0..b * h * d).map(|_| rnd()).collect();
        let dense_k: Vec<f32> = (0..b * kv * s * d).map(|_| rnd()).collect();
        let dense_v: Vec<f32> = (0..b * kv * s * d).map(|_| rnd()).collect();
        // blocks handed out in a scrambled order; block 0 unused
        let nblk = 3;
        let blocks = 1 + lens.iter().map(|l| l.div_ceil(block)).sum::<usize>();
        let mut order: Vec<u32> = (1..blocks as u32).collect();
        order.reverse();
        order.swap(0, 2);
        let mut tables = vec![0u32; b * nblk];
        let mut next = order.into_iter();
        for (bi, &len) in lens.iter().enumerate() {
            for i in 0..len.div_ceil(block) {
                tables[bi * nblk + i] = next.next().unwrap();
            }
        }
        let mut kp = vec![f32::NAN; blocks * kv * block * d];
        let mut vp = kp.clone();
        for (bi, &len) in lens.iter().enumerate() {
            for g in 0..kv {
                for j in 0..len {
                    let from = ((bi * kv + g) * s + (s - len + j)) * d;
                    let blk = tables[bi * nblk + j / block] as usize;
                    let to = ((blk * kv + g) * block + j % block) * d;
                    kp[to..to + d].copy_from_slice(&dense_k[from..from + d]);
                    vp[to..to + d].copy_from_slice(&dense_v[from..from + d]);
                }
            }
        }
        let dev = Device::Cpu;
        let qt = Tensor::from_vec(q, (b, h, 1, d), &dev).unwrap();
        let pool = |x: Vec<f32>| Tensor::from_vec(x, (blocks, kv, block, d), &dev).unwrap();
        let tt = Tensor::from_vec(tables.clone(), (b, nblk), &dev).unwrap();
        let lt = RowLens::new(lens.map(|l| l as u32).to_vec(), &dev).unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        let paged =
            paged_attention_decode(&qt, &pool(kp.clone()), &pool(vp.clone()), &tt, &lt, scale)
                .unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        // each row against its keys alone, dense, unpadded
        let mut dense = Vec::new();
        for (bi, &len) in lens.iter().enumerate() {
            let keys = |src: &[f32]| -> Tensor {
                let rows: Vec<f32> = (0..kv)
                    .flat_map(|g| {
                        let at = ((bi * kv + g) * s + s - len) * d;
                        src[at..at + len * d].to_vec()
                    })
                    .collect();
                Tensor::from_vec(rows, (1, kv, len, d), &dev).unwrap()
            };
            let qi = qt.narrow(0, bi, 1).unwrap();
            let vt = Tensor::ones((1, len), DType::U8, &dev).unwrap();
            let o = super::super::flash_attention(
                &qi,
                &keys(&dense_k),
                &keys(&dense_v),
                &vt,
                len - 1,
                scale,
                super::super::FlashBackward::Pair,
            )
            .unwrap();
            dense.extend(bits(&o));
        }
        assert_eq!(bits(&paged), dense);
        // A table naming a block outside the pool is an error, not a read beyond it.
        let mut bad = tables;
        bad[0] = blocks as u32;
        let bt = Tensor::from_vec(bad, (b, nblk), &dev).unwrap();
        assert!(
            paged_attention_decode(&qt, &pool(kp.clone()), &pool(vp.clone()), &bt, &lt, scale)
                .is_err()
        );
        // So is a row longer than its table.
        let long = RowLens::new(vec![5u32, 40, 97], &dev).unwrap();
        assert!(paged_attention_decode(&qt, &pool(kp), &pool(vp), &tt, &long, scale).is_err());
    }
}
