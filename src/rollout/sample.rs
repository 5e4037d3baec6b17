//! Drawing a token from a row of logits: [`sample_token`] on the host (the CPU twin of every
//! sampling kernel) and [`sample_rows`] for a batch, which draws on the GPU in one kernel a step
//! (kernels/sample.cu: the full distribution, or top-k / top-p / greedy).
//!
//! Every draw takes one uniform from the sample's own [`SplitMix64`] stream (see the module
//! above), so the GPU and the host draw the same token from the same logits and key.

use candle_core::{Tensor, D};

use super::SamplingParams;
use crate::model::Result;
use crate::rng::SplitMix64;

/// A token and its log-probability for each row of `logits` (f32, or bf16 as a GPU model's
/// lm_head leaves them: the same values, exactly, as f32), row r drawing from the RNG of
/// sample `rows[r]`. On a GPU one kernel draws every row and only the tokens come back: the
/// full distribution (the paper's setting), or top-k / top-p / greedy by a radix select of
/// their cuts (no sort); it draws the same one uniform from row r's stream `rngs[rows[r]]` as
/// [`sample_token`] does on the host (none when greedy), so a completion depends only on its
/// prompt and key either way. The two sum in different orders, so they agree wherever a draw or
/// a top-p cut is not within rounding of a boundary.
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
    params.check().map_err(crate::model::ModelError::Sampling)?;
    let (_, vocab) = logits.dims2()?;
    // A tensor's rows on the host, and the seconds it took to get them.
    let read_back = |t: &Tensor| -> Result<(Vec<Vec<f32>>, f64)> {
        let start = std::time::Instant::now();
        let rows = t.to_vec2::<f32>()?;
        Ok((rows, start.elapsed().as_secs_f64()))
    };
    if logits.device().is_cuda() {
        let op = Sample::new(params, vocab);
        // the same draws `sample_token` makes (none when greedy)
        let u: Vec<f64> = rows
            .iter()
            .map(|&i| if op.greedy { 0.0 } else { rngs[i].next_f64() })
            .collect();
        let u = Tensor::from_vec(u, rows.len(), logits.device())?;
        // the kernels read f32 and bf16; other dtypes (f16) as f32, the same values
        let logits = match logits.dtype() {
            candle_core::DType::F32 | candle_core::DType::BF16 => logits.clone(),
            _ => logits.to_dtype(candle_core::DType::F32)?,
        };
        let out = logits.contiguous()?.apply_op2_no_bwd(&u, &op)?;
        let (drawn, waited) = read_back(&out)?;
        return Ok((
            drawn.into_iter().map(|r| (r[0] as u32, r[1])).collect(),
            waited,
        ));
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

/// [`sample_token`]'s rule for every row at once, on CUDA (kernels/sample.cu): `sample_full_*`
/// for the full distribution, `sample_trunc_*` for top-k (`top_k` in [1, V), 0 for none),
/// top-p (`top_p` < 1) and greedy (top-k 1 at T = 1).
struct Sample {
    greedy: bool,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    temperature: f32,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    top_k: i32,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    top_p: f64,
}

impl Sample {
    /// The kernel's arguments for `params` over a vocabulary of `vocab`.
    fn new(params: &SamplingParams, vocab: usize) -> Self {
        let greedy = params.temperature <= 0.0;
        if greedy {
            return Sample {
                greedy,
                temperature: 1.0,
                top_k: 1,
                top_p: 1.0,
            };
        }
        Sample {
            greedy,
            temperature: params.temperature as f32,
            // k < V: an i32, since the kernel reads a row of V columns by i32 indices
            top_k: params
                .top_k
                .filter(|&k| k < vocab)
                .map_or(0, |k| i32::try_from(k).unwrap_or(i32::MAX)),
            top_p: params.top_p,
        }
    }

    /// Whether the full distribution's kernel applies.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn full(&self) -> bool {
        self.top_k == 0 && self.top_p >= 1.0
    }
}

impl candle_core::CustomOp2 for Sample {
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
        cuda::sample(logits, ll, u, lu, self)
    }
}

/// Draws a token from one row of logits; returns it with its log-probability. `params` as
/// [`SamplingParams::check`] accepts them ([`sample_rows`] refuses others); outside them it
/// still returns a token rather than panic (a `top_k` of 0 as none, a `top_p` of 0 or less
/// keeping the most likely token).
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
        // the first column of truncation's order (the kernel's top-k 1): the largest z, the
        // lowest index among ties; a NaN logit ranks as its order key puts it, on both sides
        let best = (0..z.len()).min_by_key(|&i| rank(&z, i)).unwrap_or(0);
        return (best as u32, log_prob(best));
    }
    let u = rng.next_f64();
    if params.full(z.len()) {
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
    let kept = kept_columns(&z, &weights, params);
    // The draw among the kept columns in index order, as the full draw walks every column.
    let mass: f64 = kept.iter().map(|&i| weights[i]).sum();
    let target = u * mass;
    let mut acc = 0.0;
    for &i in &kept {
        acc += weights[i];
        if acc > target {
            return (i as u32, log_prob(i));
        }
    }
    let last = kept[kept.len() - 1];
    (last as u32, log_prob(last))
}

/// A column's place in the order truncation sorts by: unsigned, larger `z` first, −0 the same
/// as +0 (ties then go by index). kernels/sample.cu's `order_key`, which selects by these bits.
pub(crate) fn order_key(z: f32) -> u32 {
    let b = if z == 0.0 { 0 } else { z.to_bits() };
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Column `i`'s place in truncation's order, first smallest: larger `order_key`, then lower index.
fn rank(z: &[f32], i: usize) -> (std::cmp::Reverse<u32>, usize) {
    (std::cmp::Reverse(order_key(z[i])), i)
}

/// The columns top-k and top-p keep, in index order: sorted by (`order_key` descending, index),
/// the first `top_k`, then the shortest prefix of those whose weights add to at least `top_p`
/// of theirs (summed in that order). Non-empty: the first column of the order is always kept.
fn kept_columns(z: &[f32], weights: &[f64], params: &SamplingParams) -> Vec<usize> {
    let mut order: Vec<usize> = (0..z.len()).collect();
    if let Some(k) = params.top_k.filter(|&k| (1..z.len()).contains(&k)) {
        // a strict order: the first k are one set whatever the selection's pivots
        order.select_nth_unstable_by_key(k - 1, |&i| rank(z, i));
        order.truncate(k);
    }
    order.sort_unstable_by_key(|&i| rank(z, i));
    if params.top_p < 1.0 {
        let total: f64 = order.iter().map(|&i| weights[i]).sum();
        let need = params.top_p * total;
        let mut acc = 0.0;
        if let Some(j) = order.iter().position(|&i| {
            acc += weights[i];
            acc >= need
        }) {
            order.truncate(j + 1);
        }
    }
    order.sort_unstable();
    order
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

    /// A token per row of `logits` `(rows, V)` (f32 or bf16) by `op`'s rule, row r's draw
    /// `u[r]` (f64): `(rows, 2)` f32 of [token, log-probability].
    pub fn sample(
        logits: &CudaStorage,
        ll: &Layout,
        u: &CudaStorage,
        lu: &Layout,
        op: &super::Sample,
    ) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-sample";
        let dtype = dtype_of(logits);
        let sfx = suffix(dtype, what)?;
        with_type!(dtype, T, {
            let zv = view::<T>(logits, ll, what)?;
            launch(&logits.device, ll, zv, (u, lu), op, sfx)
        })
    }

    /// [`sample`] on the logits' view `zv` (layout `ll`): kernel `sample_full_{sfx}` or
    /// `sample_trunc_{sfx}`.
    fn launch<T: candle_core::cuda_backend::CudaDType>(
        dev: &candle_core::cuda_backend::CudaDevice,
        ll: &Layout,
        zv: CudaView<'_, T>,
        (u, lu): (&CudaStorage, &Layout),
        op: &super::Sample,
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
        let name = if op.full() {
            "sample_full"
        } else {
            "sample_trunc"
        };
        let f = kernel!(dev, &format!("{name}_{sfx}"), PTX)?;
        // a double for each group of SAMPLE_GROUP columns (launch.cuh's `sample_smem`)
        let smem = v.div_ceil(sizes::SAMPLE_GROUP as usize) * 8;
        let smem = u32::try_from(smem)
            .map_err(|_| candle_core::Error::Msg(format!("{what}: a row of {v} logits")))?;
        allow_smem(&f, smem, what)?;
        let v_i = i32::try_from(v)
            .map_err(|_| candle_core::Error::Msg(format!("{what}: a row of {v} logits")))?;
        let mut b = f.builder();
        b.arg(&zv)
            .arg(&uv)
            .arg(&mut out)
            .arg(&v_i)
            .arg(&op.temperature);
        if !op.full() {
            b.arg(&op.top_k).arg(&op.top_p);
        }
        if rows > 0 {
            let cfg = LaunchConfig {
                grid_dim: (grid_dim(rows, what)?, 1, 1),
                block_dim: (sizes::SAMPLE_THREADS, 1, 1),
                shared_mem_bytes: smem,
            };
            // SAFETY: the arguments match sample_full_* / sample_trunc_* in
            // kernels/sample.cu, with the dynamic shared memory its row needs (it traps with
            // less).
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((rows, 2)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{order_key, sample_token};
    use crate::rng::SplitMix64;
    use crate::rollout::SamplingParams;

    #[test]
    fn order_keys_sort_as_the_floats_do_with_minus_zero_equal_to_zero() {
        let ascending = [
            f32::NEG_INFINITY,
            -f32::MAX,
            -1.5,
            -f32::MIN_POSITIVE,
            -1e-45,
            0.0,
            1e-45,
            f32::MIN_POSITIVE,
            1.0,
            f32::MAX,
            f32::INFINITY,
        ];
        for w in ascending.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(order_key(-0.0), order_key(0.0));
    }

    /// Settings that describe no distribution are an error naming the setting, on the CPU as
    /// on a GPU (both go through `sample_rows`); `sample_token` alone still draws, not panics.
    #[test]
    fn sample_rows_refuses_settings_outside_their_ranges() {
        let ok = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 1,
        };
        let logits =
            candle_core::Tensor::new(&[[1.0f32, 5.0, 2.0, 3.0]], &candle_core::Device::Cpu)
                .unwrap();
        let mut rngs = vec![SplitMix64::from_key(&[3])];
        assert!(super::sample_rows(&logits, &[0], &mut rngs, &ok).is_ok());
        for (bad, field) in [
            (SamplingParams { top_p: 0.0, ..ok }, "top_p"),
            (SamplingParams { top_p: -0.1, ..ok }, "top_p"),
            (
                SamplingParams {
                    top_p: f64::NAN,
                    ..ok
                },
                "top_p",
            ),
            (SamplingParams { top_p: 1.5, ..ok }, "top_p"),
            (
                SamplingParams {
                    top_k: Some(0),
                    ..ok
                },
                "top_k",
            ),
            (
                SamplingParams {
                    temperature: -1.0,
                    ..ok
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f64::NAN,
                    ..ok
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f64::INFINITY,
                    ..ok
                },
                "temperature",
            ),
        ] {
            let err = super::sample_rows(&logits, &[0], &mut rngs, &bad).unwrap_err();
            assert!(err.to_string().contains(field), "{bad:?}: {err}");
            let (token, _) = sample_token(&[1.0, 5.0, 2.0, 3.0], &bad, &mut rngs[0]);
            assert!(token < 4);
        }
        let three_d = logits.unsqueeze(0).unwrap();
        assert!(super::sample_rows(&three_d, &[0], &mut rngs, &ok).is_err());
    }

    /// Greedy takes the largest logit, the first of tied ones (−0 and +0 tie), as a scan that
    /// keeps the first strictly larger value does on any row without a NaN; a row of −∞ gives
    /// column 0.
    #[test]
    fn greedy_takes_the_first_largest_logit() {
        let greedy = SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 1,
        };
        let first_larger = |z: &[f32]| {
            let mut best = 0;
            for (i, &v) in z.iter().enumerate() {
                if v > z[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut rng = SplitMix64::from_key(&[7]);
        let mut rows: Vec<Vec<f32>> = vec![
            vec![1.0, 3.0, 3.0, 2.0],
            vec![-0.0, 0.0, -1.0],
            vec![0.0, -0.0],
            vec![f32::NEG_INFINITY; 3],
            vec![-2.0, f32::INFINITY, 5.0, f32::INFINITY],
        ];
        for _ in 0..50 {
            // quarters: many ties
            rows.push(
                (0..40)
                    .map(|_| (rng.next_f64() * 8.0).floor() as f32 / 4.0)
                    .collect(),
            );
        }
        for z in &rows {
            let (token, _) = sample_token(z, &greedy, &mut rng);
            assert_eq!(token, first_larger(z), "{z:?}");
        }
    }
}
