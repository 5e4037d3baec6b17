//! Drawing a token from a row of logits: [`sample_token`] on the host (the CPU twin of every
//! sampling kernel) and [`sample_rows`] for a batch, which draws on the GPU where a kernel
//! applies (kernels/sample.cu).
//!
//! Every draw takes one uniform from the sample's own [`SplitMix64`] stream (see the module
//! above), so the GPU and the host draw the same token from the same logits and key.

use candle_core::{Tensor, D};

use super::SamplingParams;
use crate::model::Result;
use crate::rng::SplitMix64;

/// A token and its log-probability for each row of `logits` (f32, or bf16 as a GPU model's
/// lm_head leaves them: the same values, exactly, as f32), row r drawing from the RNG of
/// sample `rows[r]`. On a GPU, full-distribution sampling (T > 0, no top-k/top-p: the paper's
/// setting) runs in one kernel and only the tokens come back; anything else (top-p < 1, top-k;
/// said once on stderr) copies the logits to the host for [`sample_token`], which draws the same
/// one uniform from row r's stream `rngs[rows[r]]`, so a completion depends only on its prompt
/// and key either way.
pub fn sample_rows(
    logits: &Tensor,
    rows: &[usize],
    rngs: &mut [SplitMix64],
    params: &SamplingParams,
) -> Result<Vec<(u32, f32)>> {
    Ok(sample_rows_waiting(logits, rows, rngs, params)?.0)
}

/// [`sample_rows`], with the seconds the host waited in the blocking read-back of the draws
/// (or, drawing on the host, of the logits): on a GPU, the queued work the device had left
/// when the host asked (the engine's [`super::GenStats::decode_wait_seconds`]).
pub(super) fn sample_rows_waiting(
    logits: &Tensor,
    rows: &[usize],
    rngs: &mut [SplitMix64],
    params: &SamplingParams,
) -> Result<(Vec<(u32, f32)>, f64)> {
    // A tensor's rows on the host, and the seconds it took to get them.
    let read_back = |t: &Tensor| -> Result<(Vec<Vec<f32>>, f64)> {
        let start = std::time::Instant::now();
        let rows = t.to_vec2::<f32>()?;
        Ok((rows, start.elapsed().as_secs_f64()))
    };
    if logits.device().is_cuda() && params.temperature > 0.0 && params.full(logits.dim(1)?) {
        // the same draw `sample_token` makes first on this path
        let u: Vec<f64> = rows.iter().map(|&i| rngs[i].next_f64()).collect();
        let u = Tensor::from_vec(u, rows.len(), logits.device())?;
        // the kernel reads f32 and bf16; other dtypes (f16) as f32, the same values
        let logits = match logits.dtype() {
            candle_core::DType::F32 | candle_core::DType::BF16 => logits.clone(),
            _ => logits.to_dtype(candle_core::DType::F32)?,
        };
        let out = logits.contiguous()?.apply_op2_no_bwd(
            &u,
            &SampleFull {
                temperature: params.temperature as f32,
            },
        )?;
        let (drawn, waited) = read_back(&out)?;
        return Ok((
            drawn.into_iter().map(|r| (r[0] as u32, r[1])).collect(),
            waited,
        ));
    }
    if logits.device().is_cuda() && params.temperature > 0.0 {
        // Said once a process: every step of such a run copies its logits to the host.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!(
                "sampling: top-p {} / top-k {:?} draw on the host (the logits copied each step); \
                 the GPU's kernel draws from the full distribution only (top-p 1, no top-k)",
                params.top_p, params.top_k
            )
        });
    }
    // bf16 to f32 is exact: the host draws from the logits' own values
    let (host, waited) = read_back(&logits.to_dtype(candle_core::DType::F32)?)?;
    let drawn = rows
        .iter()
        .enumerate()
        .map(|(r, &i)| sample_token(&host[r], params, &mut rngs[i]))
        .collect();
    Ok((drawn, waited))
}

/// [`sample_token`]'s full-distribution draw for every row at once, on CUDA (kernels/sample.cu).
struct SampleFull {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    temperature: f32,
}

impl candle_core::CustomOp2 for SampleFull {
    fn name(&self) -> &'static str {
        "acpo-sample"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &candle_core::Layout,
        _: &candle_core::CpuStorage,
        _: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        candle_core::bail!("acpo-sample: the CPU samples with sample_token")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        logits: &candle_core::CudaStorage,
        ll: &candle_core::Layout,
        u: &candle_core::CudaStorage,
        lu: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        cuda::sample_full(logits, ll, u, lu, self.temperature)
    }
}

/// Draws a token from one row of logits; returns it with its log-probability.
pub fn sample_token(logits: &[f32], params: &SamplingParams, rng: &mut SplitMix64) -> (u32, f32) {
    let greedy = params.temperature <= 0.0;
    let t = if greedy {
        1.0
    } else {
        params.temperature as f32
    };
    let z: Vec<f32> = logits.iter().map(|x| x / t).collect();
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Unnormalised weights, computed once (the draw below walks the same values in order).
    let weights: Vec<f64> = z.iter().map(|x| ((x - max) as f64).exp()).collect();
    let sum: f64 = weights.iter().sum();
    let lse = max as f64 + sum.ln();
    let log_prob = |i: usize| (z[i] as f64 - lse) as f32;
    if greedy {
        let (best, _) = z
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                if v > bv {
                    (i, v)
                } else {
                    (bi, bv)
                }
            });
        return (best as u32, log_prob(best));
    }
    // Candidate set after top-k and top-p, in descending probability when truncation applies.
    let full = params.full(z.len());
    let u = rng.next_f64();
    if full {
        let target = u * sum;
        let mut acc = 0.0;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if acc > target {
                return (i as u32, log_prob(i));
            }
        }
        let last = z.len() - 1;
        return (last as u32, log_prob(last));
    }
    let mut order: Vec<usize> = (0..z.len()).collect();
    if let Some(k) = params.top_k.filter(|&k| k < z.len()) {
        order.select_nth_unstable_by(k - 1, |&a, &b| z[b].total_cmp(&z[a]));
        order.truncate(k);
    }
    order.sort_by(|&a, &b| z[b].total_cmp(&z[a]).then(a.cmp(&b)));
    let weights: Vec<f64> = order.iter().map(|&i| weights[i]).collect();
    let mut cut = order.len();
    if params.top_p < 1.0 {
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        for (j, w) in weights.iter().enumerate() {
            acc += w / total;
            if acc >= params.top_p {
                cut = j + 1;
                break;
            }
        }
    }
    let mass: f64 = weights[..cut].iter().sum();
    let target = u * mass;
    let mut acc = 0.0;
    for j in 0..cut {
        acc += weights[j];
        if acc > target {
            return (order[j] as u32, log_prob(order[j]));
        }
    }
    (order[cut - 1] as u32, log_prob(order[cut - 1]))
}

/// Greedy argmax helper for tests and evaluation at T = 0: the index of the largest logit.
pub fn argmax(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(logits.argmax(D::Minus1)?.to_vec1::<u32>()?)
}

/// The CUDA launch of `kernels/sample.cu`; the CPU twin is [`sample_token`].
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};

    use crate::fused::launch::{
        allow_smem, dtype_of, grid_dim, kernel, ptx, sizes, suffix, view, with_type,
    };

    const PTX: (&str, &str) = ptx!("sample");

    /// A token per row of `logits` `(rows, V)` (f32 or bf16) from softmax(z / t), row r's draw
    /// `u[r]` (f64): `(rows, 2)` f32 of [token, log-probability].
    pub fn sample_full(
        logits: &CudaStorage,
        ll: &Layout,
        u: &CudaStorage,
        lu: &Layout,
        t: f32,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-sample";
        let dtype = dtype_of(logits);
        let sfx = suffix(dtype, what)?;
        with_type!(dtype, T, {
            let zv = view::<T>(logits, ll, what)?;
            launch(&logits.device, ll, zv, (u, lu), t, sfx)
        })
    }

    /// [`sample_full`] on the logits' view `zv` (layout `ll`), kernel `sample_full_{sfx}`.
    fn launch<T: candle_core::cuda_backend::CudaDType>(
        dev: &candle_core::cuda_backend::CudaDevice,
        ll: &Layout,
        zv: CudaView<'_, T>,
        (u, lu): (&CudaStorage, &Layout),
        t: f32,
        sfx: &str,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-sample";
        let uv = view::<f64>(u, lu, what)?;
        let v = ll.dims().last().copied().unwrap_or(1);
        let rows = uv.len();
        if zv.len() != rows * v || (rows > 0 && v == 0) {
            candle_core::bail!("{what}: {} logits for {rows} draws of {v}", zv.len());
        }
        // SAFETY: every row's block writes its two values.
        let mut out = unsafe { dev.alloc::<f32>(2 * rows) }?;
        let f = kernel!(dev, &format!("sample_full_{sfx}"), PTX)?;
        // a double for each group of SAMPLE_GROUP columns (launch.cuh's `sample_smem`)
        let smem = v.div_ceil(sizes::SAMPLE_GROUP as usize) * 8;
        let smem = u32::try_from(smem)
            .map_err(|_| candle_core::Error::Msg(format!("{what}: a row of {v} logits")))?;
        allow_smem(&f, smem, what)?;
        let v_i = i32::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("{what}: a row of {v} logits")))?;
        let mut b = f.builder();
        b.arg(&zv).arg(&uv).arg(&mut out).arg(&v_i).arg(&t);
        if rows > 0 {
            let cfg = LaunchConfig {
                grid_dim: (grid_dim(rows, what)?, 1, 1),
                block_dim: (sizes::SAMPLE_THREADS, 1, 1),
                shared_mem_bytes: smem,
            };
            // SAFETY: the arguments match sample_full_* in kernels/sample.cu, with the
            // dynamic shared memory its row needs (it traps with less).
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((rows, 2)),
        ))
    }
}
