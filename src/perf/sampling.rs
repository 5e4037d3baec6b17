//! The GPU suite's paged sampling runs predicted on the CPU (issue #57), the second report of
//! `acpo bench decode-predict`: each run's decode steps as the paged engine schedules them at a
//! GPU's pool ([`crate::rollout::paged_schedule`], the engine's own admission, growth and preemption
//! without a model), the bytes they read (every weight once a step, each row's KV cache so
//! far), and from those the most of issue #57's KV-bandwidth bound the shape allows (the cache's
//! share of the bytes: were every byte moved at the copy rate, the weights' too, that share of
//! the bound is what the tokens/s would reach) and the seconds the decode steps take at the copy
//! rate, at the target (70 % of the bound) and with the cache at the rate that GPU's split-K
//! decode attention (the kernel the pipelined one replaces) measured. The prefills, the warm-up
//! and the start are not counted: a step's time limit must allow more.
//!
//! A run's steps must read mostly the cache (many rows a step, long contexts) for the target to
//! be reachable at all; this is where the suite's shapes are checked, before a GPU runs them.

use serde::Serialize;

use super::decode::CopyRate;
use super::long_tail_lengths;
use crate::model::paged::PagedKv;
use crate::model::QwenConfig;
use crate::report::table::{Align::Left, Align::Right, Table};
use crate::rollout::{paged_schedule, PagedOptions, PREFILL_TOKENS};

/// One paged sampling run of the GPU suite's decode section (`tools/gpu/suite.sh`, which a test
/// holds to these): `acpo bench generate --long-tail --paged-kv --paged-only` at this shape.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SuiteRun {
    /// The run's folder in the suite's results.
    pub folder: &'static str,
    pub rows: usize,
    /// Responses per prompt (`--group`).
    pub group: usize,
    pub prompt_len: usize,
    /// The long-tailed lengths' limit (`--new-tokens`).
    pub new_tokens: usize,
    /// Bytes a number of the KV cache: 2 (bf16), 1 (`--kv-cache fp8`).
    pub kv_elem: usize,
}

/// The suite's paged runs: as many rows as a GRPO step of qwen3-1.7b-grpo samples (256 prompts
/// × 4) at the prompt limit of 1,024 (with the call's shorter responses, contexts nearer a
/// paper run's: its data's mean prompt of 153 tokens and responses of thousands), again over an
/// FP8 cache, and as many as an evaluation of 128 problems × Avg@16's 16 samples at the
/// benchmarks' mean prompt of 121 tokens; long-tailed lengths up to 2,048 (a paper run's 8,196
/// would not fit a call). Every prompt distinct (`--group 1`): a group's rows read their shared
/// prompt blocks one after another, much of it from L2, so their counted bytes would overstate
/// what the copy rate moved, most where the prompt is most of a row's context (here; a paper
/// run's prompt is ~7 % of it), and the plan carries that fraction to a paper run.
pub const SUITE_RUNS: [SuiteRun; 3] = [
    SuiteRun {
        folder: "generate-long-tail-paged",
        rows: 1024,
        group: 1,
        prompt_len: 1024,
        new_tokens: 2048,
        kv_elem: 2,
    },
    SuiteRun {
        folder: "generate-long-tail-paged-fp8",
        rows: 1024,
        group: 1,
        prompt_len: 1024,
        new_tokens: 2048,
        kv_elem: 1,
    },
    SuiteRun {
        folder: "generate-eval",
        rows: 2048,
        group: 1,
        prompt_len: 121,
        new_tokens: 2048,
        kv_elem: 2,
    },
];

/// Issue #57's target: tokens/s with long-tailed lengths ≥ this share of the KV-bandwidth
/// bound.
pub const KV_TARGET: f64 = 0.7;

/// Device memory the pool's half is not taken from besides the weights: the driver's reserve,
/// the CUDA context, cuBLAS's workspace, the model's stacked QKV copy and the sampler's own
/// tensors (an assumption; the engine takes half of what the device reports free,
/// `rollout::PagedOptions`).
pub const RESERVED_BYTES: u64 = 2 << 30;

/// The blocks of `block_bytes` a sampler's pool takes on a GPU of `memory` bytes holding
/// `weight_bytes` of weights: half of what is left after them and [`RESERVED_BYTES`] (the
/// engine takes half of what the device reports free), block 0 included.
pub fn pool_blocks(memory: u64, weight_bytes: u64, block_bytes: usize) -> usize {
    let free = memory.saturating_sub(weight_bytes + RESERVED_BYTES);
    (free / 2) as usize / block_bytes.max(1)
}

/// One suite run predicted on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct SamplingPredicted {
    pub run: SuiteRun,
    pub device: String,
    /// The pool's blocks (block 0 included) at half the memory left.
    pub pool_blocks: usize,
    pub most_rows: usize,
    pub decode_steps: usize,
    pub preempted: usize,
    /// Bytes the decode steps read: the weights once a step, and the KV cache's.
    pub weight_bytes: f64,
    pub kv_bytes: f64,
    /// The cache's share of the bytes: the most of the KV-bandwidth bound the shape allows
    /// (None, as the times, where the run has no schedule).
    pub ceiling: Option<f64>,
    /// Seconds of the decode steps at the copy rate; with the cache at [`KV_TARGET`] of the
    /// bound; with the cache at the split-K kernel's measured rate ([`split_k_fraction`]) and
    /// the weights at the copy rate.
    pub floor_seconds: Option<f64>,
    pub target_seconds: Option<f64>,
    pub split_k_seconds: Option<f64>,
    /// Why the run has no schedule on this GPU (its pool cannot hold a row), else None.
    pub unscheduled: Option<String>,
}

/// The fraction of the copy rate at which a GPU's split-K decode attention (the kernel the
/// pipelined one replaces) moved its keys and values: the mean over the shapes of many rows its
/// `flash_check` timed (`CopyRate::split_k`; one row of 8,192 keys is not a sampling run's
/// shape); None where none were timed.
pub fn split_k_fraction(rate: &CopyRate) -> Option<f64> {
    let fractions: Vec<f64> = rate
        .split_k
        .iter()
        .filter(|k| k.batch > 1 && k.ms > 0.0)
        .map(|k| k.kv_bytes() / (k.ms / 1e3) / (rate.gb_per_s * 1e9))
        .collect();
    (!fractions.is_empty()).then(|| fractions.iter().sum::<f64>() / fractions.len() as f64)
}

/// Each suite run's schedule at each GPU's pool (GPUs whose memory the run recorded); a run
/// whose pool cannot hold a row says so in its row.
pub fn predict(cfg: &QwenConfig, rates: &[CopyRate]) -> Vec<SamplingPredicted> {
    let weights = cfg.weight_bytes(2) as f64;
    let mut rows = Vec::new();
    for run in SUITE_RUNS {
        // `rows / group` distinct prompts, each `group` times in a row (`acpo bench generate`'s):
        // only their lengths and which are the same count here
        let prompts: Vec<Vec<u32>> = (0..run.rows / run.group)
            .flat_map(|g| std::iter::repeat_n(vec![g as u32; run.prompt_len], run.group))
            .collect();
        // within [1, new_tokens], the bench's limit: the engine's own limits
        let limits = long_tail_lengths(run.rows, run.new_tokens);
        let kv_per_position = cfg.kv_bytes_per_position(run.kv_elem) as f64;
        let block_bytes = PagedKv::block_bytes(cfg, run.kv_elem, crate::model::paged::BLOCK);
        let opts = PagedOptions {
            prefill_tokens: Some(PREFILL_TOKENS),
            ..PagedOptions::default()
        };
        for rate in rates {
            let Some(memory) = rate.memory_bytes else {
                continue;
            };
            let pool_blocks = pool_blocks(memory, weights as u64, block_bytes);
            let (s, unscheduled) = match paged_schedule(&prompts, &limits, None, pool_blocks, &opts)
            {
                Ok(s) => (s, None),
                Err(e) => (Default::default(), Some(e.to_string())),
            };
            let weight_bytes = s.decode_steps as f64 * weights;
            let kv_bytes = s.decode_positions as f64 * kv_per_position;
            let copy = rate.gb_per_s * 1e9;
            let scheduled = |x: f64| unscheduled.is_none().then_some(x);
            rows.push(SamplingPredicted {
                run,
                device: rate.device.clone(),
                pool_blocks,
                most_rows: s.most_rows,
                decode_steps: s.decode_steps,
                preempted: s.preempted,
                weight_bytes,
                kv_bytes,
                ceiling: scheduled(kv_bytes / (weight_bytes + kv_bytes).max(1.0)),
                floor_seconds: scheduled((weight_bytes + kv_bytes) / copy),
                target_seconds: scheduled(kv_bytes / (KV_TARGET * copy)),
                split_k_seconds: split_k_fraction(rate)
                    .and_then(|f| scheduled(kv_bytes / (f * copy) + weight_bytes / copy)),
                unscheduled,
            });
        }
    }
    rows
}

/// Writes `sampling-predicted.{json,md}` under `out`: the suite's paged runs of `model` (its
/// config `cfg`) at each GPU's pool ([`predict`]).
pub fn write(
    cfg: &QwenConfig,
    model: &str,
    rates: &[CopyRate],
    out: &std::path::Path,
) -> super::Result<std::path::PathBuf> {
    let rows = predict(cfg, rates);
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the prediction is JSON");
    super::write_report(out, "sampling-predicted.json", json.as_bytes())?;
    super::write_report(
        out,
        "sampling-predicted.md",
        markdown(model, rates, &rows).as_bytes(),
    )
}

/// sampling-predicted.md: what the numbers are, then a row per run and GPU.
pub fn markdown(model: &str, rates: &[CopyRate], rows: &[SamplingPredicted]) -> String {
    let thousands = super::decode::thousands;
    let mut t = Table::new([
        ("run", Left),
        ("rows × (prompt + ≤ new)", Left),
        ("GPU", Left),
        ("pool positions", Right),
        ("most rows at once", Right),
        ("decode steps", Right),
        ("rows preempted", Right),
        ("GB read (weights + cache)", Right),
        ("ceiling: the cache's share", Right),
        ("s at the copy rate", Right),
        ("s at the target", Right),
        ("s, the cache at the split-K kernel's rate", Right),
    ]);
    for r in rows {
        let run = &r.run;
        let counted = |what: String| {
            if r.unscheduled.is_some() {
                "—".to_string()
            } else {
                what
            }
        };
        let seconds = |s: Option<f64>| s.map_or("—".into(), |s| format!("{s:.1}"));
        t.row([
            format!(
                "`{}`{}",
                run.folder,
                if run.kv_elem == 1 { " (FP8)" } else { "" }
            ),
            format!(
                "{}{} × ({} + ≤ {})",
                thousands(run.rows as f64),
                if run.group > 1 {
                    format!(" (groups of {})", run.group)
                } else {
                    String::new()
                },
                thousands(run.prompt_len as f64),
                thousands(run.new_tokens as f64)
            ),
            r.device.clone(),
            thousands((r.pool_blocks * crate::model::paged::BLOCK) as f64),
            match &r.unscheduled {
                Some(why) => format!("none: {why}"),
                None => thousands(r.most_rows as f64),
            },
            counted(thousands(r.decode_steps as f64)),
            counted(thousands(r.preempted as f64)),
            counted(format!(
                "{} + {}",
                thousands(r.weight_bytes / 1e9),
                thousands(r.kv_bytes / 1e9)
            )),
            r.ceiling
                .map_or("—".into(), |c| format!("{:.1} %", 100.0 * c)),
            seconds(r.floor_seconds),
            seconds(r.target_seconds),
            seconds(r.split_k_seconds),
        ]);
    }
    let split_k: Vec<String> = rates
        .iter()
        .filter_map(|r| split_k_fraction(r).map(|f| format!("{} {:.1} %", r.label(), 100.0 * f)))
        .collect();
    format!(
        "**Predicted, not measured.** The GPU suite's paged sampling runs of {model} (`acpo bench generate --long-tail --paged-kv --paged-only`, every prompt distinct: `perf::sampling::SUITE_RUNS`) as the paged engine schedules them at each GPU's pool: half of what is left of the memory the run recorded (`nvidia-smi`) after the bf16 weights and {:.0} GiB (an assumption), in blocks of {} positions, prefills of at most {} positions; the engine's own admission, growth and preemption without a model (`rollout::paged_schedule`, held to the engine's counts in `tests/it/model.rs`). Its decode steps read every weight once and each row's cache so far; the ceiling is the cache's share of those bytes, the most of issue #57's KV-bandwidth bound the run can show (were every byte moved at the copy rate), so a run whose ceiling is below the target's {:.0} % cannot meet it whatever its kernels. The seconds are the decode steps' alone (the prefills, the warm-up and the start not counted, so a suite step must allow more): at the measured copy rate, with the cache at the target's share of the bound, and with the cache at the rate the GPU's split-K decode attention (the kernel the pipelined one replaces) reached in `flash_check` at its shapes of many rows ({}; the FP8 run's bytes at the same rate, no split-K kernel reads FP8), the weights at the copy rate. `acpo bench decode-predict` (`perf::sampling`) writes it.\n\n{t}",
        RESERVED_BYTES as f64 / f64::from(1u32 << 30),
        crate::model::paged::BLOCK,
        thousands(PREFILL_TOKENS as f64),
        100.0 * KV_TARGET,
        if split_k.is_empty() {
            "no GPU timed it".to_string()
        } else {
            split_k.join(", ") + " of the copy rate"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3_17b() -> QwenConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("experiments/paper/configs/qwen3-1.7b.json");
        QwenConfig::load(&path).expect("config")
    }

    fn gpu(memory_gib: u64, split_k: Vec<crate::perf::decode::SplitK>) -> CopyRate {
        CopyRate {
            device: format!("GPU-{memory_gib}"),
            source: std::path::PathBuf::new(),
            gb_per_s: 2000.0,
            split_k,
            memory_bytes: Some(memory_gib << 30),
        }
    }

    /// The bytes are the schedule's (the weights once a step, the cache at its positions), the
    /// times those bytes at the rates; a GPU with more memory holds more rows at once, so its
    /// steps read more cache beside the same weights (a higher ceiling) in fewer steps; an
    /// FP8 cache holds twice the positions in the same pool. A GPU without a recorded memory
    /// is left out; one whose pool cannot hold a row is a row that says so.
    #[test]
    fn a_larger_pool_holds_more_rows_and_reads_more_of_its_bytes_from_the_cache() {
        let cfg = qwen3_17b();
        // the split-K kernel at 64 × 1,025 keys in the time that moves its cache at a quarter
        // of the copy rate (and one row of 8,192 keys at a tenth, not a sampling run's shape)
        let at = |batch: usize, keys: usize, fraction: f64| {
            let mut k = crate::perf::decode::SplitK {
                batch,
                keys,
                kv_heads: 8,
                head_dim: 128,
                ms: 0.0,
            };
            k.ms = k.kv_bytes() / (fraction * 2e12) * 1e3;
            k
        };
        let quarter = vec![at(64, 1025, 0.25), at(1, 8192, 0.1)];
        let rows = predict(&cfg, &[gpu(40, quarter.clone()), gpu(80, vec![])]);
        assert_eq!(rows.len(), 2 * SUITE_RUNS.len());
        let weights = cfg.weight_bytes(2) as f64;
        for r in &rows {
            assert!(r.unscheduled.is_none(), "{r:?}");
            assert_eq!(r.weight_bytes, r.decode_steps as f64 * weights);
            let ceiling = r.ceiling.expect("scheduled");
            assert!((ceiling - r.kv_bytes / (r.weight_bytes + r.kv_bytes)).abs() < 1e-12);
            let bytes = r.weight_bytes + r.kv_bytes;
            let floor = r.floor_seconds.expect("scheduled");
            assert!((floor - bytes / 2e12).abs() < 1e-9 * floor);
            let target = r.kv_bytes / (0.7 * 2e12);
            assert!((r.target_seconds.expect("scheduled") - target).abs() < 1e-9 * target);
            assert!(r.most_rows <= r.run.rows && r.most_rows > 0);
            // at least the longest response's steps (its first token is its prefill's)
            let longest = long_tail_lengths(r.run.rows, r.run.new_tokens)
                .into_iter()
                .max()
                .expect("rows");
            assert!(r.decode_steps >= longest - 1, "{r:?}");
        }
        let of = |device: &str, folder: &str| {
            rows.iter()
                .find(|r| r.device == device && r.run.folder == folder)
                .expect("a row")
        };
        let (small, large) = (
            of("GPU-40", "generate-long-tail-paged"),
            of("GPU-80", "generate-long-tail-paged"),
        );
        assert!(large.pool_blocks > 2 * small.pool_blocks);
        assert!(large.most_rows > small.most_rows, "{small:?} {large:?}");
        assert!(large.ceiling > small.ceiling);
        // fewer rows at once: the rows wait, more steps read the weights for the same cache
        assert!(
            small.decode_steps > large.decode_steps,
            "{small:?} {large:?}"
        );
        assert_eq!(small.kv_bytes, large.kv_bytes);
        let fp8 = of("GPU-40", "generate-long-tail-paged-fp8");
        assert!(fp8.pool_blocks.abs_diff(2 * small.pool_blocks) <= 1);
        assert!(fp8.most_rows > small.most_rows);
        // the cache at a quarter of the copy rate, the weights at it
        let split = small.split_k_seconds.expect("timed");
        let want = small.kv_bytes / (0.25 * 2e12) + small.weight_bytes / 2e12;
        assert!((split - want).abs() < 1e-9 * want);
        assert!(large.split_k_seconds.is_none());
        let unknown = CopyRate {
            memory_bytes: None,
            ..gpu(80, vec![])
        };
        assert!(predict(&cfg, &[unknown]).is_empty());
        // 4 GiB: less than the weights and the reserve, no pool
        let none = predict(&cfg, &[gpu(4, vec![])]);
        assert_eq!(none.len(), SUITE_RUNS.len());
        for r in &none {
            let why = r.unscheduled.as_deref().expect("no schedule");
            assert!(why.contains("exhausted"), "{why}");
        }
        assert!(none
            .iter()
            .all(|r| r.ceiling.is_none() && r.floor_seconds.is_none()));
        let md = markdown("qwen3-1.7b", &[gpu(4, vec![])], &none);
        assert!(
            md.contains("| none: ") && md.contains("no GPU timed it"),
            "{md}"
        );
        let md = markdown("qwen3-1.7b", &[gpu(40, quarter)], &rows);
        assert!(md.contains("GPU 25.0 % of the copy rate"), "{md}");
    }
}
