//! The GPU suite's paged sampling runs predicted on the CPU (issue #57), the second report of
//! `acpo bench decode-predict`: each run's decode steps as the paged engine schedules them at a
//! GPU's pool ([`crate::rollout::paged_schedule`], the engine's own admission, growth and preemption
//! without a model), the bytes they read (every weight once a step, each row's KV cache so
//! far), and from those the most of issue #57's KV-bandwidth bound the shape allows (the cache's
//! share of the bytes: were every byte moved at the copy rate, the weights' too, that share of
//! the bound is what the tokens/s would reach) and the seconds the decode steps take at the copy
//! rate, at the target (70 % of the bound) and at the fraction of the copy rate that GPU's last
//! paper-shape run reached. The prefills are not counted (compute-bound, a few seconds a run).
//!
//! A run's steps must read mostly the cache (many rows a step, long contexts) for the target to
//! be reachable at all; this is where the suite's shapes are checked, before a GPU runs them.

use serde::Serialize;

use super::decode::CopyRate;
use super::{long_tail_lengths, Result};
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

/// The suite's paged runs: a GRPO step's rollouts of qwen3-1.7b-grpo (256 prompts × 4) at the
/// prompt limit of 1,024 (with the call's shorter responses, contexts nearer a paper run's: its
/// data's mean prompt of 153 tokens and responses of thousands), again over an FP8 cache, and
/// the evaluations' shape (128 problems × Avg@16's 16 samples at the benchmarks' mean prompt of
/// 121 tokens); long-tailed lengths up to 2,048 (a paper run's 8,196 would not fit a call).
pub const SUITE_RUNS: [SuiteRun; 3] = [
    SuiteRun {
        folder: "generate-long-tail-paged",
        rows: 1024,
        group: 4,
        prompt_len: 1024,
        new_tokens: 2048,
        kv_elem: 2,
    },
    SuiteRun {
        folder: "generate-long-tail-paged-fp8",
        rows: 1024,
        group: 4,
        prompt_len: 1024,
        new_tokens: 2048,
        kv_elem: 1,
    },
    SuiteRun {
        folder: "generate-eval",
        rows: 2048,
        group: 16,
        prompt_len: 121,
        new_tokens: 2048,
        kv_elem: 2,
    },
];

/// Issue #57's target: tokens/s with long-tailed lengths ≥ this share of the KV-bandwidth
/// bound.
pub const KV_TARGET: f64 = 0.7;

/// Device memory the pool's half is not taken from besides the weights: the CUDA context,
/// cuBLAS's workspace, the sampler's own tensors (an assumption; the engine takes half of what
/// the device reports free, `rollout::PagedOptions`).
pub const RESERVED_BYTES: u64 = 1 << 30;

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
    /// The cache's share of the bytes: the most of the KV-bandwidth bound the shape allows.
    pub ceiling: f64,
    /// Seconds of the decode steps at the copy rate; with the cache at [`KV_TARGET`] of the
    /// bound; at the fraction of the copy rate the GPU's last paper-shape run reached.
    pub floor_seconds: f64,
    pub target_seconds: f64,
    pub at_last_seconds: Option<f64>,
}

/// Each suite run's schedule at each GPU's pool (GPUs whose memory the run recorded).
pub fn predict(cfg: &QwenConfig, rates: &[CopyRate]) -> Result<Vec<SamplingPredicted>> {
    let weights = cfg.weight_bytes(2) as f64;
    let mut rows = Vec::new();
    for run in SUITE_RUNS {
        // `rows / group` distinct prompts, each `group` times in a row (`acpo bench generate`'s):
        // only their lengths and which are the same count here
        let prompts: Vec<Vec<u32>> = (0..run.rows / run.group)
            .flat_map(|g| std::iter::repeat_n(vec![g as u32; run.prompt_len], run.group))
            .collect();
        let limits = long_tail_lengths(run.rows, run.new_tokens);
        let kv_per_position = cfg.kv_bytes_per_position(run.kv_elem) as f64;
        for rate in rates {
            let Some(memory) = rate.memory_bytes else {
                continue;
            };
            let free = memory.saturating_sub(weights as u64 + RESERVED_BYTES);
            let block_bytes = PagedKv::block_bytes(cfg, run.kv_elem, crate::model::paged::BLOCK);
            let pool_blocks = (free / 2) as usize / block_bytes.max(1);
            let opts = PagedOptions {
                prefill_tokens: Some(PREFILL_TOKENS),
                ..PagedOptions::default()
            };
            let s = paged_schedule(&prompts, &limits, None, pool_blocks, &opts)?;
            let weight_bytes = s.decode_steps as f64 * weights;
            let kv_bytes = s.decode_positions as f64 * kv_per_position;
            let copy = rate.gb_per_s * 1e9;
            rows.push(SamplingPredicted {
                run,
                device: rate.device.clone(),
                pool_blocks,
                most_rows: s.most_rows,
                decode_steps: s.decode_steps,
                preempted: s.preempted,
                weight_bytes,
                kv_bytes,
                ceiling: kv_bytes / (weight_bytes + kv_bytes).max(1.0),
                floor_seconds: (weight_bytes + kv_bytes) / copy,
                target_seconds: kv_bytes / (KV_TARGET * copy),
                at_last_seconds: rate
                    .fraction
                    .map(|f| (weight_bytes + kv_bytes) / (f * copy)),
            });
        }
    }
    Ok(rows)
}

/// sampling-predicted.md: what the numbers are, then a row per run and GPU.
pub fn markdown(model: &str, rows: &[SamplingPredicted]) -> String {
    let mut t = Table::new([
        ("run", Left),
        ("rows (groups) × (prompt + ≤ new)", Left),
        ("GPU", Left),
        ("pool positions", Right),
        ("most rows at once", Right),
        ("decode steps", Right),
        ("rows preempted", Right),
        ("GB read (weights + cache)", Right),
        ("ceiling: the cache's share", Right),
        ("s at the copy rate", Right),
        ("s at the target", Right),
        ("s at the last run's fraction", Right),
    ]);
    for r in rows {
        let run = &r.run;
        t.row([
            format!(
                "`{}`{}",
                run.folder,
                if run.kv_elem == 1 { " (FP8)" } else { "" }
            ),
            format!(
                "{} ({}) × ({} + ≤ {})",
                super::decode::thousands(run.rows as f64),
                run.group,
                super::decode::thousands(run.prompt_len as f64),
                super::decode::thousands(run.new_tokens as f64)
            ),
            r.device.clone(),
            super::decode::thousands((r.pool_blocks * crate::model::paged::BLOCK) as f64),
            r.most_rows.to_string(),
            super::decode::thousands(r.decode_steps as f64),
            r.preempted.to_string(),
            format!("{:.0} + {:.0}", r.weight_bytes / 1e9, r.kv_bytes / 1e9),
            format!("{:.1} %", 100.0 * r.ceiling),
            format!("{:.1}", r.floor_seconds),
            format!("{:.1}", r.target_seconds),
            r.at_last_seconds.map_or("—".into(), |s| format!("{s:.1}")),
        ]);
    }
    format!(
        "**Predicted, not measured.** The GPU suite's paged sampling runs of {model} (`acpo bench generate --long-tail --paged-kv --paged-only`, `perf::sampling::SUITE_RUNS`) as the paged engine schedules them at each GPU's pool: half of the memory the run recorded (`nvidia-smi`) less the bf16 weights and {:.0} GiB (an assumption), in blocks of {} positions, prefills of at most {} positions; the engine's own admission, growth and preemption without a model (`rollout::paged_schedule`, held to the engine's counts in `tests/it/model.rs`). Its decode steps read every weight once and each row's cache so far; the ceiling is the cache's share of those bytes, the most of issue #57's KV-bandwidth bound the run can show (were every byte moved at the copy rate), so a run whose ceiling is below the target's {:.0} % cannot meet it whatever its kernels. The seconds are the decode steps' alone (prefills not counted): at the measured copy rate, with the cache at the target's share of the bound, and at the fraction of the copy rate the GPU's last paper-shape run reached (the time its suite step must allow). `acpo bench decode-predict` (`perf::sampling`) writes it.\n\n{t}",
        RESERVED_BYTES as f64 / f64::from(1u32 << 30),
        crate::model::paged::BLOCK,
        super::decode::thousands(PREFILL_TOKENS as f64),
        100.0 * KV_TARGET,
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

    fn gpu(memory_gib: u64, fraction: Option<f64>) -> CopyRate {
        CopyRate {
            device: format!("GPU-{memory_gib}"),
            source: std::path::PathBuf::new(),
            gb_per_s: 2000.0,
            split_k_ms: vec![],
            fraction,
            memory_bytes: Some(memory_gib << 30),
        }
    }

    /// The bytes are the schedule's (the weights once a step, the cache at its positions), the
    /// times those bytes at the rates; a GPU with more memory holds more rows at once, so its
    /// steps read more cache beside the same weights (a higher ceiling) and preempt less; an
    /// FP8 cache holds twice the positions in the same pool. A GPU without a recorded memory
    /// is left out.
    #[test]
    fn a_larger_pool_holds_more_rows_and_reads_more_of_its_bytes_from_the_cache() {
        let cfg = qwen3_17b();
        let rows = predict(&cfg, &[gpu(40, Some(0.25)), gpu(80, None)]).expect("predicts");
        assert_eq!(rows.len(), 2 * SUITE_RUNS.len());
        let weights = cfg.weight_bytes(2) as f64;
        for r in &rows {
            assert_eq!(r.weight_bytes, r.decode_steps as f64 * weights);
            assert!((r.ceiling - r.kv_bytes / (r.weight_bytes + r.kv_bytes)).abs() < 1e-12);
            let bytes = r.weight_bytes + r.kv_bytes;
            assert!((r.floor_seconds - bytes / 2e12).abs() < 1e-9 * r.floor_seconds);
            assert!((r.target_seconds - r.kv_bytes / (0.7 * 2e12)).abs() < 1e-9 * r.target_seconds);
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
        assert!(large.preempted <= small.preempted);
        let fp8 = of("GPU-40", "generate-long-tail-paged-fp8");
        assert!(fp8.pool_blocks.abs_diff(2 * small.pool_blocks) <= 1);
        assert!(fp8.most_rows > small.most_rows);
        assert!(small.at_last_seconds.is_some() && large.at_last_seconds.is_none());
        let at = small.at_last_seconds.expect("fraction");
        assert!((at - small.floor_seconds / 0.25).abs() < 1e-9 * at);
        let unknown = CopyRate {
            memory_bytes: None,
            ..gpu(80, None)
        };
        assert!(predict(&cfg, &[unknown]).expect("nothing").is_empty());
    }
}
