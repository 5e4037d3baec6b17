//! `acpo bench generate` and `acpo bench long-tail`: the sampler's tokens per second on random
//! prompts (waves, and continuous batching of a long-tailed set of lengths), beside the HBM
//! roofline of the device's measured copy bandwidth.

use std::ops::Range;
use std::time::Instant;

use super::{
    copy_bandwidth, median_of, Measurement, Result, Roofline, SampleShape, SpeedOptions, Subject,
    Target,
};
use crate::model::qwen::Qwen;
use crate::model::{init, QwenConfig};
use crate::rollout::{self, GenStats, SampleRequest, SamplingParams};

/// `batch` rows of `len` random tokens, seeded: `batch / group` distinct prompts, each `group`
/// times in a row (a GRPO group, Avg@k's k samples of a problem).
fn prompt_ids(vocab: usize, batch: usize, len: usize, group: usize) -> Vec<Vec<u32>> {
    let mut rng = crate::rng::SplitMix64::new(11);
    (0..batch / group)
        .flat_map(|_| {
            let prompt: Vec<u32> = (0..len)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect();
            std::iter::repeat_n(prompt, group)
        })
        .collect()
}

/// What the sampling benchmarks share: a seeded random model of `cfg` on the target, detached,
/// in the inference dtype; `shape.batch` random prompts with their keys; sampling at T = 1 of
/// up to `shape.new_tokens`.
struct Sampler<'t> {
    target: &'t Target,
    precision: crate::model::Precision,
    params: crate::model::Params,
    model: Qwen,
    prompts: Vec<Vec<u32>>,
    keys: Vec<[u64; 4]>,
    params_at_t1: SamplingParams,
}

/// How the long-tail benchmark batches its continuous runs: the dense cache's rows, so many
/// at once; or the paged cache, as many rows as its pool holds (at most so many when given).
#[derive(Clone, Copy)]
enum Batching {
    Dense(usize),
    Paged(Option<usize>),
}

impl<'t> Sampler<'t> {
    fn new(cfg: &QwenConfig, target: &'t Target, shape: &SampleShape) -> Result<Sampler<'t>> {
        if shape.group == 0 || !shape.batch.is_multiple_of(shape.group) {
            return Err(super::PerfError::Shape(format!(
                "--group {} must divide --batch {} (rows: prompts × responses per prompt)",
                shape.group, shape.batch
            )));
        }
        if shape.paged_only && !(shape.long_tail && shape.paged) {
            return Err(super::PerfError::Shape(
                "--paged-only is the long-tail benchmark's paged run alone: it needs --long-tail \
                 and --paged-kv"
                    .into(),
            ));
        }
        let precision = crate::model::Precision::inference(target.dtype);
        let composed = !crate::model::qwen::Kernels::for_device(&target.device).flash_attention;
        let need = sampling_bytes(cfg, shape, precision, composed, &target.device);
        crate::model::budget::check(&target.device, need, || {
            format!(
                "--batch {} prompts of --prompt-len {} + --new-tokens {} tokens{}",
                shape.batch,
                shape.prompt_len,
                shape.new_tokens,
                shape
                    .max_batch
                    .map_or_else(String::new, |n| format!(", --max-batch {n} at once")),
            )
        })?;
        let params = init::random_params(cfg, 0, precision.master, &target.device)?;
        Ok(Sampler {
            target,
            model: Qwen::new(cfg, &params, true)?.with_kv_cache(shape.kv_cache)?,
            precision,
            params,
            prompts: prompt_ids(cfg.vocab_size, shape.batch, shape.prompt_len, shape.group),
            keys: (0..shape.batch as u64).map(|i| [0, 0, i, 0]).collect(),
            params_at_t1: SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                top_k: None,
                max_new_tokens: shape.new_tokens,
            },
        })
    }

    /// Seconds of sampling the prompts `range` as `request` says, the device's work done, and
    /// the tokens drawn.
    fn run(&self, range: Range<usize>, request: &SampleRequest) -> Result<(f64, usize)> {
        let t = Instant::now();
        let out = rollout::generate(
            &self.model,
            &self.prompts[range.clone()],
            &self.keys[range],
            request,
        )?;
        self.target.sync()?;
        let drawn = out.iter().map(|c| c.tokens.len()).sum();
        Ok((t.elapsed().as_secs_f64(), drawn))
    }

    /// Seconds of sampling every prompt to its limit in `limits`, `slots` at a time, each wave
    /// a batch that ends with its longest sequence (finished ones leave it, none join).
    fn waves(&self, limits: &[usize], slots: usize) -> Result<f64> {
        let t = Instant::now();
        for start in (0..self.prompts.len()).step_by(slots) {
            let r = start..(start + slots).min(self.prompts.len());
            self.run(
                r.clone(),
                &SampleRequest::new(self.params_at_t1).limits(limits[r].to_vec()),
            )?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Seconds of sampling every prompt to its limit in `limits` with continuous batching (a
    /// waiting prompt takes a finished one's place), and what its prefills and decode steps
    /// took.
    fn continuous(&self, limits: &[usize], batching: Batching) -> Result<(f64, GenStats)> {
        let stats = std::sync::Mutex::new(GenStats::default());
        let req = SampleRequest::new(self.params_at_t1)
            .limits(limits.to_vec())
            .stats(&stats);
        let req = match batching {
            Batching::Dense(slots) => req.max_batch(slots),
            Batching::Paged(Some(n)) => req.max_batch(n).paged(rollout::PagedOptions::default()),
            Batching::Paged(None) => req.paged(rollout::PagedOptions::default()),
        };
        let (secs, _) = self.run(0..self.prompts.len(), &req)?;
        Ok((secs, stats.into_inner().unwrap_or_else(|e| e.into_inner())))
    }

    /// The median of `repeats` continuous runs (by seconds), with its stats.
    fn median_continuous(
        &self,
        limits: &[usize],
        batching: Batching,
        repeats: usize,
    ) -> Result<(f64, GenStats)> {
        let mut runs = (0..repeats.max(1))
            .map(|_| self.continuous(limits, batching))
            .collect::<Result<Vec<_>>>()?;
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(runs[runs.len() / 2])
    }

    /// Bytes a decode step reads: every weight once (the compute dtype), and the cache's keys
    /// and values for each position a row attends over.
    fn step_bytes(&self, cfg: &QwenConfig) -> (f64, f64) {
        (
            self.params.count() as f64 * self.precision.compute.size_in_bytes() as f64,
            cfg.kv_bytes_per_position(self.model.kv_elem_bytes()) as f64,
        )
    }

    /// A measurement of sampling `tokens` in `secs` (median of `repeats`), `shape` in words.
    fn measured(
        &self,
        m: &Subject,
        tokens: usize,
        secs: f64,
        repeats: usize,
        shape: String,
    ) -> Measurement {
        Measurement {
            model: m.name.clone(),
            parameters: self.params.count(),
            what: "generate",
            target: self.target.name(),
            tokens,
            seconds: secs,
            tokens_per_second: tokens as f64 / secs,
            repeats,
            shape: Some(shape),
            mfu: None,
            memory: None,
            roofline: None,
            trace: None,
            settings: None,
        }
    }
}

/// Bytes the sampling benchmarks hold at least, computed from the shape before anything is
/// allocated: the weights, the prompts' ids and the sampled ones (u32), and a forward over the
/// sequences decoded at once (the fewest either benchmark decodes at once: `max_batch`, else a
/// quarter of the batch, else for the paged run alone on CUDA a prefill group and one row)
/// with room in the cache for the new tokens, the cache at the bytes it holds on `device` (one
/// a number for an FP8 cache of E4M3 bytes).
fn sampling_bytes(
    cfg: &QwenConfig,
    shape: &SampleShape,
    precision: crate::model::Precision,
    composed: bool,
    device: &candle_core::Device,
) -> u128 {
    let (cached, prefilled) = held_rows(shape, device.is_cuda());
    let ids = 4 * shape.batch as u128 * (shape.prompt_len as u128 + shape.new_tokens as u128);
    let compute = precision.compute.size_in_bytes();
    let kv_elem = if shape.kv_cache.holds_bytes(device) {
        1
    } else {
        compute
    };
    cfg.weight_bytes(precision.master.size_in_bytes())
        + ids
        + cfg.activation_bytes(prefilled, shape.prompt_len, compute, composed)
        + cfg.kv_cache_bytes(cached, shape.prompt_len + shape.new_tokens, kv_elem)
}

/// The rows whose cache and whose prefill's activations [`sampling_bytes`] counts: --max-batch's;
/// for the paged run alone on CUDA, whose pool takes half the free memory whatever the batch,
/// one row's cache and a prefill group of at most [`rollout::PREFILL_TOKENS`] positions; else
/// a quarter of the batch. Each at least 1 and at most the batch.
fn held_rows(shape: &SampleShape, cuda: bool) -> (usize, usize) {
    let quarter = shape.batch.div_ceil(4);
    let (cached, prefilled) = match shape.max_batch {
        Some(n) => (n, n),
        None if shape.paged_only && cuda => (1, rollout::PREFILL_TOKENS / shape.prompt_len.max(1)),
        None => (quarter, quarter),
    };
    let rows = |n: usize| n.clamp(1, shape.batch.max(1));
    (rows(cached), rows(prefilled))
}

/// Sampling throughput: `batch` prompts of `prompt_len` tokens, `new_tokens` new tokens each at
/// T = 1 (no early stop), through the sampling engine with `max_batch` slots; median of
/// `repeats` runs after a warm-up. The tokens counted are the new ones.
pub fn bench_generate(m: &Subject, opts: &SpeedOptions) -> Result<Measurement> {
    let shape = &opts.sample;
    let s = Sampler::new(&m.cfg, &opts.target, shape)?;
    // The same prompts and slots sampled for `new_tokens` each.
    let request = |new_tokens: usize| {
        let r = SampleRequest::new(SamplingParams {
            max_new_tokens: new_tokens,
            ..s.params_at_t1
        });
        let r = match shape.max_batch {
            Some(n) => r.max_batch(n),
            None => r,
        };
        if shape.paged {
            r.paged(rollout::PagedOptions::default())
        } else {
            r
        }
    };
    // Median seconds of `repeats` runs of `request` after a warm-up of `warm` (the same run
    // without stats: a first run's one-time costs are not the host's share of a step).
    let time = |warm: &SampleRequest, request: &SampleRequest| -> Result<f64> {
        s.run(0..shape.batch, warm)?;
        median_of(opts.repeats, || {
            let (secs, drawn) = s.run(0..shape.batch, request)?;
            debug_assert_eq!(drawn, shape.batch * request.params.max_new_tokens);
            Ok(secs)
        })
    };
    // The measured full runs keep stats for the host's share of their decode time (a run then
    // starts from an idle device and its prefill ends with the device's work done: two waits a
    // run, the decode steps untouched).
    let stats = std::sync::Mutex::new(GenStats::default());
    let secs = time(
        &request(shape.new_tokens),
        &request(shape.new_tokens).stats(&stats),
    )?;
    let stats = stats.into_inner().unwrap_or_else(|e| e.into_inner());
    // The prefill alone: one new token each.
    let prefill_seconds = time(&request(1), &request(1))?;
    let tokens = shape.batch * shape.new_tokens;
    let mut row = s.measured(m, tokens, secs, opts.repeats, generate_shape(shape, &s));
    row.roofline = Some(steady_roofline(
        &s,
        &m.cfg,
        shape,
        secs,
        prefill_seconds,
        &stats,
    )?);
    Ok(row)
}

/// `bench_generate`'s decode steps against the bytes they must read: every weight once a step
/// and each sequence's cache so far, on average prompt + N/2 positions of K and V in every
/// layer; the decode time is the run's less its prefill's (`prefill_seconds`, a run of one new
/// token each).
fn steady_roofline(
    s: &Sampler,
    cfg: &QwenConfig,
    shape: &SampleShape,
    secs: f64,
    prefill_seconds: f64,
    stats: &GenStats,
) -> Result<Roofline> {
    let steps = shape.new_tokens.saturating_sub(1).max(1);
    let decode_seconds = (secs - prefill_seconds).max(f64::MIN_POSITIVE);
    let (weights, kv_per_position) = s.step_bytes(cfg);
    let context = shape.prompt_len as f64 + shape.new_tokens as f64 / 2.0;
    let bytes_per_step = weights + shape.batch as f64 * context * kv_per_position;
    let step_seconds = decode_seconds / steps as f64;
    let copy = copy_bandwidth(s.target)?;
    Ok(Roofline {
        bytes_per_step,
        step_seconds,
        prefill_seconds,
        decode_tokens_per_second: (shape.batch * steps) as f64 / decode_seconds,
        achieved_gb_per_s: bytes_per_step / step_seconds / 1e9,
        copy_gb_per_s: copy / 1e9,
        fraction: bytes_per_step / step_seconds / copy,
        host_share: stats.host_share(),
        kv_elem_bytes: s.model.kv_elem_bytes(),
    })
}

/// `bench_generate`'s shape in words: the prompts, the new tokens, the slots and, where it
/// holds bytes, an FP8 cache (on the CPU it keeps its values in the model's dtype, whose
/// bytes the roofline counts).
fn generate_shape(shape: &SampleShape, s: &Sampler) -> String {
    format!(
        "{} prompts of {} + {} new tokens{}{}{}",
        shape.batch,
        shape.prompt_len,
        shape.new_tokens,
        groups(shape),
        shape
            .max_batch
            .map_or_else(String::new, |n| format!(", {n} at once")),
        match (shape.paged, shape.kv_cache.holds_bytes(&s.target.device)) {
            (true, true) => ", paged FP8 KV cache",
            (true, false) => ", paged KV cache",
            (false, true) => ", FP8 KV cache",
            (false, false) => "",
        }
    )
}

/// The groups of a shape in words (none for one response a prompt).
fn groups(shape: &SampleShape) -> String {
    if shape.group > 1 {
        format!(
            " ({} distinct × {} responses)",
            shape.batch / shape.group,
            shape.group
        )
    } else {
        String::new()
    }
}

/// Response lengths of the long-tail benchmark: ⌈N·u⁶⌉ for u uniform in [0, 1), seeded. The
/// median is N/64, a tenth run past 0.53·N, and a few reach N (RL responses: most end early,
/// some run to the limit).
pub fn long_tail_lengths(n: usize, max: usize) -> Vec<usize> {
    let mut rng = crate::rng::SplitMix64::new(13);
    (0..n)
        .map(|_| ((max as f64 * rng.next_f64().powi(6)).ceil() as usize).clamp(1, max))
        .collect()
}

/// Sampling with long-tailed response lengths ([`long_tail_lengths`]), `max_batch` sequences
/// at a time (on a GPU without `--max-batch`: as many as its memory holds,
/// [`rollout::device_slots`], as training and evaluation decode): in waves (each wave a batch
/// that ends with its longest sequence; finished ones leave it, none join), then with
/// continuous batching (a waiting prompt takes a finished one's place). The same prompts, keys
/// and lengths; tokens/s of new tokens. The continuous run carries its roofline: the bytes its
/// decode steps must read (every weight once a step, each row's own cache so far) over the
/// device's copy rate, beside the time its decode steps took. With `paged`, a third run over
/// the paged KV cache, as many rows at once as its pool holds, with the roofline of the steps
/// and positions its engine counted; with `paged_only`, that run alone (a batch of many rows,
/// where waves and the dense cache would cost a GPU call more than it).
pub fn bench_long_tail(m: &Subject, opts: &SpeedOptions) -> Result<Vec<Measurement>> {
    let shape = &opts.sample;
    let s = Sampler::new(&m.cfg, &opts.target, shape)?;
    let limits = long_tail_lengths(shape.batch, shape.new_tokens);
    let slots = shape
        .max_batch
        .or_else(|| rollout::device_slots(&s.model, shape.prompt_len + shape.new_tokens))
        .unwrap_or(shape.batch.div_ceil(4))
        .max(1);
    let (dense, paged) = (Batching::Dense(slots), Batching::Paged(shape.max_batch));
    let tokens: usize = limits.iter().sum();
    let fp8 = if shape.kv_cache.holds_bytes(&s.target.device) {
        ", FP8 KV cache"
    } else {
        ""
    };
    let prompts = format!(
        "{} prompts of {}{}, long-tailed lengths ≤ {} (Σ {tokens})",
        shape.batch,
        shape.prompt_len,
        groups(shape),
        shape.new_tokens
    );
    // The warm-up (kernels loaded, the products' plans made at every batch size the runs
    // meet) at two tokens a prompt: a whole run in waves, the slowest, cost the GPU suite's
    // call as much as the measurement.
    let short: Vec<usize> = limits.iter().map(|&l| l.min(2)).collect();
    if !shape.paged_only {
        s.continuous(&short, dense)?;
    }
    if shape.paged {
        s.continuous(&short, paged)?;
    }
    let (weights, kv_per_position) = s.step_bytes(&m.cfg);
    let copy = copy_bandwidth(s.target)?;
    let drawn = tokens - shape.batch.min(tokens);
    let mut rows = Vec::new();
    if !shape.paged_only {
        let waves = s.measured(
            m,
            tokens,
            median_of(opts.repeats, || s.waves(&limits, slots))?,
            opts.repeats,
            format!("{prompts}, {slots} at once: waves{fp8}"),
        );
        let (secs, stats) = s.median_continuous(&limits, dense, opts.repeats)?;
        let read = continuous_reads(&limits, shape.prompt_len, slots, weights, kv_per_position);
        let how = format!(
            "continuous batching ({} prompts joined in finished rows' places, {} copies of the \
             batch's cache, rows of at most {} columns)",
            stats.joined_in_place, stats.cache_moves, stats.widest_cache
        );
        let mut cont = s.measured(
            m,
            tokens,
            secs,
            opts.repeats,
            format!("{prompts}, {slots} at once: {how}{fp8}"),
        );
        cont.roofline = Some(decode_roofline(
            read,
            &stats,
            drawn,
            copy,
            s.model.kv_elem_bytes(),
        ));
        rows.extend([waves, cont]);
    }
    if shape.paged {
        // The same prompts, keys and lengths through the paged cache; the rows it decoded at
        // once are the pool's choice, so its row says how many. Its reads, as the engine
        // counted them (a preempted row's again when it is recomputed).
        let (secs, stats) = s.median_continuous(&limits, paged, opts.repeats)?;
        let read = DecodeReads::counted(&stats, weights, kv_per_position);
        let roofline = decode_roofline(read, &stats, drawn, copy, s.model.kv_elem_bytes());
        let mut row = s.measured(
            m,
            tokens,
            secs,
            opts.repeats,
            format!(
                "{prompts}, continuous batching over the paged KV cache, at most {} at once, the \
                 widest prefill {} positions; decode {:.0} tokens/s{fp8}",
                stats.most_rows, stats.widest_prefill, roofline.decode_tokens_per_second,
            ),
        );
        row.roofline = Some(roofline);
        rows.push(row);
    }
    Ok(rows)
}

/// A decode run's roofline: what its decode steps read (`read`) in `stats`' decode seconds,
/// `drawn` tokens (all but each prompt's first, which its prefill gives), against the device's
/// measured `copy` rate.
fn decode_roofline(
    read: DecodeReads,
    stats: &GenStats,
    drawn: usize,
    copy: f64,
    kv_elem_bytes: usize,
) -> Roofline {
    let seconds = stats.decode_seconds.max(f64::MIN_POSITIVE);
    let steps = read.steps.max(1) as f64;
    Roofline {
        bytes_per_step: read.bytes / steps,
        step_seconds: seconds / steps,
        prefill_seconds: stats.prefill_seconds,
        decode_tokens_per_second: drawn as f64 / seconds,
        achieved_gb_per_s: read.bytes / seconds / 1e9,
        copy_gb_per_s: copy / 1e9,
        fraction: read.bytes / seconds / copy,
        host_share: stats.host_share(),
        kv_elem_bytes,
    }
}

/// The KV cache that the decode steps of prompts of `prompt_len` sampled to `limits` read when
/// no row stops early or is preempted, whatever their schedule: a row reads its own positions so
/// far at each of its steps, from the prompt's length plus one to the prompt's plus its limit
/// less one (its first token comes from the prefill), `kv_per_position` bytes each. The
/// engines count what they read (`GenStats::decode_positions`); tests hold them to this.
pub fn kv_reads(limits: &[usize], prompt_len: usize, kv_per_position: f64) -> f64 {
    let positions: f64 = limits
        .iter()
        .map(|&l| {
            let steps = l.max(1) as f64 - 1.0;
            steps * prompt_len as f64 + steps * (steps + 1.0) / 2.0
        })
        .sum();
    positions * kv_per_position
}

/// What the decode steps of a continuous-batching run must read at least.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeReads {
    /// Decode steps (each drawing a token for every row that goes on).
    pub steps: usize,
    /// Every weight once a step, and each row's own keys and values so far (its prompt and
    /// the tokens before the one it feeds).
    pub bytes: f64,
}

impl DecodeReads {
    /// What a run's decode steps read, as its engine counted them (`GenStats::decode_steps`,
    /// `decode_positions`): `weights` bytes once a step, `kv_per_position` bytes for each
    /// position a row attended over.
    pub fn counted(stats: &GenStats, weights: f64, kv_per_position: f64) -> DecodeReads {
        DecodeReads {
            steps: stats.decode_steps,
            bytes: stats.decode_steps as f64 * weights
                + stats.decode_positions as f64 * kv_per_position,
        }
    }
}

/// The decode steps [`rollout::generate`] makes for prompts of `prompt_len` tokens with response
/// lengths `limits`, `slots` at a time (a finished row's place taken by the next waiting
/// prompt, whose first token its prefill gives), and the bytes they read: `weights` a step and
/// `kv_per_position` for each cached position a row attends to.
pub fn continuous_reads(
    limits: &[usize],
    prompt_len: usize,
    slots: usize,
    weights: f64,
    kv_per_position: f64,
) -> DecodeReads {
    let mut waiting = limits.iter().map(|&l| l.max(1));
    // (tokens drawn, limit) of each row decoding
    let mut active: Vec<(usize, usize)> = waiting
        .by_ref()
        .take(slots.max(1))
        .map(|l| (0, l))
        .collect();
    let (mut steps, mut bytes) = (0usize, 0.0f64);
    while !active.is_empty() {
        for row in &mut active {
            row.0 += 1;
        }
        let before = active.len();
        active.retain(|&(n, l)| n < l);
        let decoding = active.len();
        if decoding > 0 {
            steps += 1;
            let positions: usize = active.iter().map(|&(n, _)| prompt_len + n).sum();
            bytes += weights + positions as f64 * kv_per_position;
        }
        active.extend(waiting.by_ref().take(before - decoding).map(|l| (0, l)));
    }
    DecodeReads { steps, bytes }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory check counts an FP8 cache of bytes at one byte a number, a cache of values at
    /// the compute dtype's; nothing else changes.
    #[test]
    fn sampling_bytes_count_the_cache_at_the_bytes_it_holds() {
        use crate::model::qwen::KvCacheDtype;
        let json = r#"{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 1e4}"#;
        let cfg = QwenConfig::from_json(json, std::path::Path::new("config.json")).unwrap();
        let precision = crate::model::Precision {
            master: candle_core::DType::BF16,
            compute: candle_core::DType::BF16,
        };
        let cpu = candle_core::Device::Cpu;
        let need = |kv_cache| {
            let shape = SampleShape {
                batch: 8,
                prompt_len: 10,
                new_tokens: 6,
                max_batch: Some(4),
                kv_cache,
                ..SampleShape::default()
            };
            sampling_bytes(&cfg, &shape, precision, false, &cpu)
        };
        let model = need(KvCacheDtype::Model);
        assert_eq!(need(KvCacheDtype::Fp8E4m3Values), model);
        assert_eq!(need(KvCacheDtype::Fp8E4m3), model, "values on the CPU");
        // 4 rows of 16 positions, 2 layers × K and V × 2 heads × 8 numbers, a byte less each
        let saved = (4 * 16 * 2 * 2 * 2 * 8) as u128;
        assert_eq!(need(KvCacheDtype::Fp8E4m3Bytes), model - saved);
    }

    /// The memory check holds a paged run alone on CUDA to one row's cache and a prefill group
    /// (its pool sizes itself to the free memory), whatever the batch; every other run to
    /// --max-batch's rows, else a quarter of the batch.
    #[test]
    fn the_paged_run_alone_on_cuda_is_checked_at_one_row_and_a_prefill_group() {
        let shape = |max_batch, paged_only| SampleShape {
            batch: 2048,
            prompt_len: 121,
            max_batch,
            long_tail: true,
            paged: true,
            paged_only,
            ..SampleShape::default()
        };
        assert_eq!(held_rows(&shape(None, true), true), (1, 16_384 / 121));
        assert_eq!(held_rows(&shape(None, true), false), (512, 512));
        assert_eq!(held_rows(&shape(None, false), true), (512, 512));
        assert_eq!(held_rows(&shape(Some(64), true), true), (64, 64));
        let long = SampleShape {
            prompt_len: 20_000,
            ..shape(None, true)
        };
        assert_eq!(held_rows(&long, true), (1, 1));
    }

    /// Three prompts of 10 tokens, two slots: the first finishes on its prefill's token, the
    /// third takes its place; every decode step reads the weights and each row's own positions.
    #[test]
    fn continuous_reads_follow_the_engine_s_schedule() {
        let r = continuous_reads(&[1, 3, 2], 10, 2, 100.0, 1.0);
        // step 1: the second row (11 positions); step 2: the second (12) and the third (11)
        assert_eq!(r.steps, 2);
        assert_eq!(r.bytes, 100.0 + 11.0 + 100.0 + 12.0 + 11.0);
        // one slot: each prompt alone, its length − 1 steps
        let alone = continuous_reads(&[4, 1, 2], 5, 1, 0.0, 1.0);
        assert_eq!(alone.steps, 3 + 1);
        assert_eq!(alone.bytes, (6 + 7 + 8 + 6) as f64);
        // the cache's share is the schedule's to none: the same at every slot count
        for slots in 1..=4 {
            let r = continuous_reads(&[1, 3, 2, 7], 10, slots, 100.0, 1.0);
            assert_eq!(
                r.bytes,
                r.steps as f64 * 100.0 + kv_reads(&[1, 3, 2, 7], 10, 1.0)
            );
        }
    }
}
