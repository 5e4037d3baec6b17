//! Several seeds per run (`acpo reproduce --seeds N`, issue #22): each matched pair's
//! differences with 95 % confidence intervals paired by seed, and the mean curves with their
//! bands.
//!
//! A seed varies everything random in the RL phase (sampling, shuffling); every seed starts from
//! the same created model. For each seed present in both runs of a pair, the difference
//! Δ = (-AC) − (baseline) of its best and of its final weighted accuracy is taken; the table
//! gives the mean Δ with Student's t interval over seeds (n − 1 degrees of freedom). Step
//! speedup per seed: the first evaluation at which the -AC run reaches that seed's baseline
//! best (Section 5.3's definition, seed by seed).

use std::collections::BTreeSet;

use super::{model_order, RunResult};
use crate::eval::EvalSummary;
use crate::manifest::AlgorithmKind;

/// The 0.975 quantile of Student's t with `df` degrees of freedom: a two-sided 95 % interval.
/// Tabulated to 30 (the usual tables' values, to three decimals); beyond, the Cornish–Fisher
/// expansion around the normal quantile, within 1e-3 of the exact value there.
pub fn t_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        _ => {
            let (z, v) = (1.959_964_f64, df as f64);
            z + (z.powi(3) + z) / (4.0 * v)
                + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v * v)
        }
    }
}

/// A mean over seeds and its 95 % t interval (none from one value).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub n: usize,
    pub mean: f64,
    /// Half the interval's width; None for n < 2.
    pub half_width: Option<f64>,
}

impl Interval {
    pub fn of(xs: &[f64]) -> Option<Interval> {
        let n = xs.len();
        if n == 0 {
            return None;
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        let half_width = (n >= 2).then(|| {
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            t_975(n - 1) * (var / n as f64).sqrt()
        });
        Some(Interval {
            n,
            mean,
            half_width,
        })
    }

    /// `mean [lo, hi]` with `digits` decimals (the mean alone from one value).
    pub fn show(&self, digits: usize) -> String {
        match self.half_width {
            Some(h) => format!(
                "{:+.d$} [{:+.d$}, {:+.d$}]",
                self.mean,
                self.mean - h,
                self.mean + h,
                d = digits
            ),
            None => format!("{:+.d$}", self.mean, d = digits),
        }
    }
}

/// One matched pair of one model over its seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct PairStats {
    pub model: String,
    pub baseline: AlgorithmKind,
    /// Seeds present in both runs, ascending.
    pub seeds: Vec<u64>,
    /// Means over those seeds, in points (%).
    pub baseline_best: f64,
    pub ac_best: f64,
    /// Δ of the best weighted accuracy and of the final one, in points.
    pub best_diff: Interval,
    pub final_diff: Interval,
    /// Seeds in which the -AC run reached the baseline's best.
    pub reached: usize,
    /// The step at which it did, over those seeds.
    pub ac_step: Option<Interval>,
    /// The baseline's own best step, over all seeds.
    pub baseline_step: Interval,
}

fn final_eval(r: &RunResult) -> Option<&EvalSummary> {
    r.evals.iter().max_by_key(|e| e.step)
}

/// Every seed of every run, paired by (model, seed).
pub fn pairs(runs: &[RunResult]) -> Vec<PairStats> {
    let mut out = Vec::new();
    for model in model_order(runs.iter().map(|r| r.model.clone())) {
        for (base, ac) in [
            (AlgorithmKind::Ppo, AlgorithmKind::PpoAc),
            (AlgorithmKind::Grpo, AlgorithmKind::GrpoAc),
        ] {
            let of = |m: AlgorithmKind, seed: u64| {
                runs.iter()
                    .find(|r| r.model == model && r.algorithm == m && r.seed == seed)
            };
            let seeds: BTreeSet<u64> = runs
                .iter()
                .filter(|r| r.model == model && r.algorithm == base)
                .map(|r| r.seed)
                .filter(|&s| of(ac, s).is_some())
                .collect();
            let (mut b_best, mut a_best, mut best_d, mut final_d) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut ac_steps, mut base_steps) = (Vec::new(), Vec::new());
            let mut used = Vec::new();
            for &seed in &seeds {
                let (Some(b), Some(a)) = (of(base, seed), of(ac, seed)) else {
                    continue;
                };
                let (Some(bb), Some(ab), Some(bf), Some(af)) =
                    (b.best(), a.best(), final_eval(b), final_eval(a))
                else {
                    continue;
                };
                used.push(seed);
                b_best.push(100.0 * bb.weighted_accuracy);
                a_best.push(100.0 * ab.weighted_accuracy);
                best_d.push(100.0 * (ab.weighted_accuracy - bb.weighted_accuracy));
                final_d.push(100.0 * (af.weighted_accuracy - bf.weighted_accuracy));
                base_steps.push(bb.step as f64);
                let mut evals: Vec<&EvalSummary> = a.evals.iter().collect();
                evals.sort_by_key(|e| e.step);
                if let Some(e) = evals
                    .iter()
                    .find(|e| e.weighted_accuracy >= bb.weighted_accuracy)
                {
                    ac_steps.push(e.step as f64);
                }
            }
            let (Some(best_diff), Some(final_diff), Some(baseline_step)) = (
                Interval::of(&best_d),
                Interval::of(&final_d),
                Interval::of(&base_steps),
            ) else {
                continue;
            };
            out.push(PairStats {
                model: model.clone(),
                baseline: base,
                seeds: used,
                baseline_best: b_best.iter().sum::<f64>() / b_best.len() as f64,
                ac_best: a_best.iter().sum::<f64>() / a_best.len() as f64,
                best_diff,
                final_diff,
                reached: ac_steps.len(),
                ac_step: Interval::of(&ac_steps),
                baseline_step,
            });
        }
    }
    out
}

/// Whether any (model, method) has runs of more than one seed.
pub fn several(runs: &[RunResult]) -> bool {
    runs.iter().any(|r| {
        runs.iter()
            .any(|o| o.model == r.model && o.algorithm == r.algorithm && o.seed != r.seed)
    })
}

/// The runs of the smallest seed of each (model, method): what the single-run artifacts
/// (Table 1, speedups, regime, entropy, tails) are built from.
pub fn first_seed(runs: &[RunResult]) -> Vec<RunResult> {
    let mut out: Vec<RunResult> = Vec::new();
    for r in runs {
        match out
            .iter_mut()
            .find(|o| o.model == r.model && o.algorithm == r.algorithm)
        {
            Some(o) if r.seed < o.seed => *o = r.clone(),
            Some(_) => {}
            None => out.push(r.clone()),
        }
    }
    out
}

/// seeds.md: each matched pair over its seeds.
pub fn markdown(all: &[PairStats]) -> String {
    let mut s = String::from(
        "| model | -AC vs | seeds | baseline best | -AC best | Δ best [95 % CI] | Δ final [95 % CI] | -AC reaches the baseline's best | at step [95 % CI] | baseline's best step [95 % CI] |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in all {
        let seeds = match (p.seeds.first(), p.seeds.last()) {
            (Some(a), Some(b)) if p.seeds.len() > 1 => format!("{} ({a}–{b})", p.seeds.len()),
            (Some(a), _) => format!("1 ({a})"),
            _ => "0".into(),
        };
        let steps = |i: &Interval| match i.half_width {
            Some(h) => format!("{:.1} [{:.1}, {:.1}]", i.mean, i.mean - h, i.mean + h),
            None => format!("{:.1}", i.mean),
        };
        s.push_str(&format!(
            "| {} | {} | {seeds} | {:.1} | {:.1} | {} | {} | {} of {} | {} | {} |\n",
            p.model,
            p.baseline.paper_name(),
            p.baseline_best,
            p.ac_best,
            p.best_diff.show(1),
            p.final_diff.show(1),
            p.reached,
            p.seeds.len(),
            p.ac_step.as_ref().map_or("—".into(), steps),
            steps(&p.baseline_step),
        ));
    }
    s.push_str(
        "\nWeighted accuracy in points. Δ = (-AC) − (baseline), seed by seed; the interval is Student's t over seeds (n − 1 degrees of freedom). \
         A pair's difference is resolved at 95 % when its interval excludes 0. \
         \"Reaches\": the first evaluation at which the -AC run is at least as good as the same seed's baseline best.\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_the_tables_and_approach_the_normal() {
        assert_eq!(t_975(4), 2.776);
        assert_eq!(t_975(30), 2.042);
        // exact values: 2.0211 (df 40), 1.9840 (df 100)
        assert!((t_975(40) - 2.0211).abs() < 1e-3, "{}", t_975(40));
        assert!((t_975(100) - 1.9840).abs() < 1e-3, "{}", t_975(100));
        assert!(t_975(0).is_nan());
    }

    #[test]
    fn a_paired_interval_is_the_textbook_one() {
        // mean 3, sample sd sqrt(2.5), se sqrt(0.5), t(4) = 2.776
        let i = Interval::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).expect("interval");
        assert_eq!(i.n, 5);
        assert!((i.mean - 3.0).abs() < 1e-12);
        assert!((i.half_width.expect("n ≥ 2") - 2.776 * 0.5f64.sqrt()).abs() < 1e-12);
        assert_eq!(i.show(1), "+3.0 [+1.0, +5.0]");
        let one = Interval::of(&[0.25]).expect("one");
        assert_eq!((one.half_width, one.show(2)), (None, "+0.25".to_string()));
        assert_eq!(Interval::of(&[]), None);
    }
}
