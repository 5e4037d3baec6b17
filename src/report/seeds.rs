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

use std::collections::{BTreeMap, BTreeSet};

use super::table::{Align::Left, Align::Right, Table};
use super::{load_metrics, model_order, Result, RunResult};
use crate::algo::method::AlgorithmKind;
use crate::eval::EvalSummary;
use crate::run::metric;

/// The 0.975 quantile of Student's t with `df` degrees of freedom: a two-sided 95 % interval.
/// Tabulated to 30 (the usual tables' values, to three decimals); beyond, the Cornish–Fisher
/// expansion around the normal quantile, within 1e-3 of the exact value there.
pub fn t_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    t_quantile(&TABLE, 1.959_964, df)
}

/// A t quantile: `table` up to 30 degrees of freedom, then the Cornish–Fisher expansion around
/// the normal quantile `z` (within 1e-3 of the exact value beyond 30).
fn t_quantile(table: &[f64; 30], z: f64, df: usize) -> f64 {
    match df {
        0 => f64::NAN,
        1..=30 => table[df - 1],
        _ => {
            let v = df as f64;
            z + (z.powi(3) + z) / (4.0 * v)
                + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v * v)
        }
    }
}

/// The 0.80 quantile of Student's t with `df` degrees of freedom: 80 % power in a sample-size
/// calculation. Tabulated to 30 as [`t_975`], the Cornish–Fisher expansion beyond.
pub fn t_80(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870,
        0.868, 0.866, 0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856,
        0.855, 0.855, 0.854, 0.854,
    ];
    t_quantile(&TABLE, 0.841_621, df)
}

/// The gain the powered design was sized on for a family, in points of weighted accuracy: the
/// yardstick of the power analysis (issue #38). Round sizes: +2 for PPO-AC, +1 for GRPO-AC.
/// Table 1's own gains are 1.6–4.0 and 0.6–1.5 points (the verdict's margins,
/// [`paper_gains`]), so these sit inside the PPO range and above the GRPO range's low end.
pub fn paper_effect(baseline: AlgorithmKind) -> f64 {
    if baseline.is_ppo_type() {
        2.0
    } else {
        1.0
    }
}

/// The paper's gain of each -AC method over its baseline, per model of Table 1
/// (`paper/table1.csv`, weighted accuracy in points): (paper model, baseline, gain).
pub fn paper_gains() -> Vec<(String, AlgorithmKind, f64)> {
    let weighted = super::paper_values(super::PAPER_TABLE1, &[super::WEIGHTED_CSV.to_string()]);
    let acc = |model: &str, method: AlgorithmKind| {
        weighted
            .get(&(model.to_string(), method.paper_name().to_string()))
            .and_then(|v| v[0])
    };
    let mut out = Vec::new();
    for (model, method) in weighted.keys() {
        for (base, ac) in [
            (AlgorithmKind::Ppo, AlgorithmKind::PpoAc),
            (AlgorithmKind::Grpo, AlgorithmKind::GrpoAc),
        ] {
            if method != base.paper_name() {
                continue;
            }
            if let (Some(b), Some(a)) = (acc(model, base), acc(model, ac)) {
                // the CSV's one decimal: 70.6 − 70.0 is 0.6, not 0.5999…
                out.push((model.clone(), base, ((a - b) * 10.0).round() / 10.0));
            }
        }
    }
    out
}

/// The paper model a mini model stands in for (tools/generators/make_mini_manifests.py, SIZES;
/// each mini manifest's first line says the same).
pub fn stands_for(model: &str) -> &str {
    match model {
        "qwen3-mini-xs" => "Qwen3-1.7B",
        "qwen3-mini-s" => "Qwen3-4B",
        "qwen3-mini-m" => "Qwen2.5-Math-7B",
        "qwen3-mini-l" => "Qwen3-8B",
        other => other,
    }
}

/// Table 1's gain for a pair of `model` (or the model it stands in for); None for a model
/// outside the table.
pub fn paper_gain(model: &str, baseline: AlgorithmKind) -> Option<f64> {
    let paper = stands_for(model);
    paper_gains()
        .into_iter()
        .find(|(m, b, _)| m == paper && *b == baseline)
        .map(|(_, _, g)| g)
}

/// The smallest gain Table 1 reports for a family (PPO-AC over PPO, or GRPO-AC over GRPO):
/// the margin below which the verdict calls a gain "smaller than any the paper reports".
pub fn paper_low_end(baseline: AlgorithmKind) -> f64 {
    paper_gains()
        .into_iter()
        .filter(|(_, b, _)| *b == baseline)
        .map(|(_, _, g)| g)
        .fold(f64::INFINITY, f64::min)
}

/// The fewest seeds whose paired t test (two-sided, 5 %) finds a true difference of `effect`
/// points with 80 % power, when the paired differences have standard deviation `sd`: the
/// smallest n ≥ 2 with (t₀.₉₇₅,ₙ₋₁ + t₀.₈₀,ₙ₋₁)·sd/√n ≤ effect. None above 10,000 (or when `sd`
/// or `effect` is not positive and finite).
pub fn seeds_needed(sd: f64, effect: f64) -> Option<usize> {
    if !(sd.is_finite() && effect.is_finite() && effect > 0.0 && sd >= 0.0) {
        return None;
    }
    (2..=10_000).find(|&n| detectable(sd, n) <= effect)
}

/// The smallest difference `n` seeds detect with 80 % power at 5 % (two-sided), in the units
/// of `sd`.
pub fn detectable(sd: f64, n: usize) -> f64 {
    (t_975(n - 1) + t_80(n - 1)) * sd / (n as f64).sqrt()
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

    /// The sample standard deviation the interval came from (None for n < 2).
    pub fn sd(&self) -> Option<f64> {
        self.half_width
            .map(|h| h * (self.n as f64).sqrt() / t_975(self.n - 1))
    }

    /// The interval's upper end: with the lower, the bound the data put on the effect at 95 %.
    pub fn upper(&self) -> Option<f64> {
        self.half_width.map(|h| self.mean + h)
    }

    /// `mean [lo, hi]` with `digits` decimals and signs (the mean alone from one value): a
    /// difference.
    pub fn show(&self, digits: usize) -> String {
        self.written(digits, true)
    }

    /// As [`Interval::show`], without signs: a level, such as an accuracy.
    pub fn show_unsigned(&self, digits: usize) -> String {
        self.written(digits, false)
    }

    fn written(&self, digits: usize, signed: bool) -> String {
        let num = |v: f64| {
            if signed {
                format!("{v:+.digits$}")
            } else {
                format!("{v:.digits$}")
            }
        };
        match self.half_width {
            Some(h) => format!(
                "{} [{}, {}]",
                num(self.mean),
                num(self.mean - h),
                num(self.mean + h)
            ),
            None => num(self.mean),
        }
    }

    /// `(x, lo, hi)`: the interval as a figure's band at `x` (zero-width from one value).
    pub fn band_at(&self, x: f64) -> (f64, f64, f64) {
        let h = self.half_width.unwrap_or(0.0);
        (x, self.mean - h, self.mean + h)
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
    /// Seeds in which the -AC run reached the baseline's best before, at and after the
    /// baseline's own best step (never: `seeds − reached`).
    pub earlier: usize,
    pub same: usize,
    pub later: usize,
    /// Δ of the policy entropy at the last logged step (nats per token); None when a run
    /// logged none.
    pub entropy_diff: Option<Interval>,
    /// Per seed, the §5.3 step count made symmetric in the two runs: the steps the baseline
    /// takes to first reach the lower of the two runs' bests, minus the steps the -AC run takes
    /// (> 0: -AC sooner). Swapping the runs' labels flips its sign, which the label-swap test
    /// uses; "reaches the baseline's best" (above) is not symmetric: under the null the -AC
    /// run's best is the lower one in about half the seeds, and then it never reaches it.
    pub step_gaps: Vec<i64>,
    /// What each rule did in these runs, means over seeds (None where a run logged none).
    pub regime: Regime,
}

/// How much the pair's two rules act in its runs, and how far entropy moves: what a verdict on
/// the pair can speak to. Fractions of tokens; entropy in nats per token; means over seeds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Regime {
    /// Each run's own clip active, over all its mini-batches.
    pub baseline_clip: Option<f64>,
    pub ac_clip: Option<f64>,
    /// Tokens of the later mini-batches where the ratio clip and ACPO's clip disagree (one
    /// zeroes the gradient, the other keeps it), in the -AC runs.
    pub ac_disagree: Option<f64>,
    /// Entropy at the first and at the last logged step, baseline then -AC.
    pub baseline_entropy: Option<(f64, f64)>,
    pub ac_entropy: Option<(f64, f64)>,
}

/// The first index at which `curve` (evaluations in step order: (step, accuracy)) reaches
/// `target`.
fn first_at(curve: &[(usize, f64)], target: f64) -> Option<usize> {
    curve.iter().find(|(_, a)| *a >= target).map(|(s, _)| *s)
}

/// One seed's symmetric step gap (see [`PairStats::step_gaps`]): both curves reach the lower of
/// their bests, by construction; None for an empty curve.
pub fn step_gap(baseline: &[(usize, f64)], ac: &[(usize, f64)]) -> Option<i64> {
    let best = |c: &[(usize, f64)]| c.iter().map(|(_, a)| *a).fold(f64::NAN, f64::max);
    let target = best(baseline).min(best(ac));
    let (b, a) = (first_at(baseline, target)?, first_at(ac, target)?);
    Some(b as i64 - a as i64)
}

/// A run's evaluation curve, (step, weighted accuracy) in step order.
pub fn curve(r: &RunResult) -> Vec<(usize, f64)> {
    let mut c: Vec<(usize, f64)> = r
        .evals
        .iter()
        .map(|e| (e.step, e.weighted_accuracy))
        .collect();
    c.sort_by_key(|(s, _)| *s);
    c
}

/// Means over seeds of what [`Regime`] reports, from each run's metrics.
#[derive(Default)]
struct RegimeSums {
    baseline_clip: Vec<f64>,
    ac_clip: Vec<f64>,
    ac_disagree: Vec<f64>,
    baseline_entropy: Vec<(f64, f64)>,
    ac_entropy: Vec<(f64, f64)>,
}

impl RegimeSums {
    /// One seed's baseline and -AC runs, each with its metrics lines.
    fn add(
        &mut self,
        (baseline, b): (&RunResult, &[BTreeMap<String, f64>]),
        (ac, a): (&RunResult, &[BTreeMap<String, f64>]),
    ) {
        let mean = |lines: &[BTreeMap<String, f64>], keys: &[&str]| {
            let v: Vec<f64> = lines
                .iter()
                .filter_map(|m| keys.iter().map(|k| m.get(*k).copied()).sum::<Option<f64>>())
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let ends = |lines: &[BTreeMap<String, f64>]| {
            let e =
                |m: Option<&BTreeMap<String, f64>>| m.and_then(|m| m.get(metric::ENTROPY).copied());
            e(lines.first()).zip(e(lines.last()))
        };
        self.baseline_clip
            .extend(mean(b, &[baseline.clip.own_clip_metric()]));
        self.ac_clip.extend(mean(a, &[ac.clip.own_clip_metric()]));
        self.ac_disagree.extend(mean(
            a,
            &[
                "actor/clip_disagree_ratio_zeroes_later",
                "actor/clip_disagree_acpo_zeroes_later",
            ],
        ));
        self.baseline_entropy.extend(ends(b));
        self.ac_entropy.extend(ends(a));
    }

    fn means(&self) -> Regime {
        let m = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let m2 = |v: &[(f64, f64)]| {
            m(&v.iter().map(|x| x.0).collect::<Vec<_>>())
                .zip(m(&v.iter().map(|x| x.1).collect::<Vec<_>>()))
        };
        Regime {
            baseline_clip: m(&self.baseline_clip),
            ac_clip: m(&self.ac_clip),
            ac_disagree: m(&self.ac_disagree),
            baseline_entropy: m2(&self.baseline_entropy),
            ac_entropy: m2(&self.ac_entropy),
        }
    }
}

fn final_eval(r: &RunResult) -> Option<&EvalSummary> {
    r.evals.iter().max_by_key(|e| e.step)
}

/// The policy entropy at the last step a run logged.
fn last_entropy(lines: &[BTreeMap<String, f64>]) -> Option<f64> {
    lines.last().and_then(|m| m.get(metric::ENTROPY).copied())
}

/// Every seed of every run, paired by (model, seed).
pub fn pairs(runs: &[RunResult]) -> Result<Vec<PairStats>> {
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
                .collect();
            let (mut b_best, mut a_best, mut best_d, mut final_d) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut ac_steps, mut base_steps) = (Vec::new(), Vec::new());
            let (mut earlier, mut same, mut later) = (0, 0, 0);
            let mut entropy_d = Vec::new();
            let mut entropy_everywhere = true;
            let mut used = Vec::new();
            let mut step_gaps = Vec::new();
            let mut regime = RegimeSums::default();
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
                if let Some(e) = a.first_reaching(bb.weighted_accuracy) {
                    ac_steps.push(e.step as f64);
                    match e.step.cmp(&bb.step) {
                        std::cmp::Ordering::Less => earlier += 1,
                        std::cmp::Ordering::Equal => same += 1,
                        std::cmp::Ordering::Greater => later += 1,
                    }
                }
                step_gaps.extend(step_gap(&curve(b), &curve(a)));
                let (metrics_b, metrics_a) = (load_metrics(&b.dir)?, load_metrics(&a.dir)?);
                regime.add((b, &metrics_b), (a, &metrics_a));
                match (last_entropy(&metrics_a), last_entropy(&metrics_b)) {
                    (Some(ea), Some(eb)) => entropy_d.push(ea - eb),
                    _ => entropy_everywhere = false,
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
                earlier,
                same,
                later,
                entropy_diff: if entropy_everywhere {
                    Interval::of(&entropy_d)
                } else {
                    None
                },
                step_gaps,
                regime: regime.means(),
            });
        }
    }
    Ok(out)
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

/// power.md (issue #38): per matched pair, the standard deviation of its paired differences
/// over the seeds at hand, the smallest difference those seeds detect (80 % power, 5 %
/// two-sided), and the seeds a paired t test needs to detect the design's size of gain for the
/// family ([`paper_effect`]: +1 point GRPO-AC, +2 points PPO-AC) with 80 % power at 5 %.
pub fn power_markdown(all: &[PairStats]) -> String {
    let mut t = Table::new([
        ("model", Left),
        ("-AC vs", Left),
        ("seeds", Right),
        ("sd of Δ best", Right),
        ("sd of Δ final", Right),
        ("detectable Δ best at these seeds", Right),
        ("design's size", Right),
        ("seeds for it, best", Right),
        ("seeds for it, final", Right),
    ]);
    let needed = |sd: Option<f64>, effect: f64| {
        sd.and_then(|sd| seeds_needed(sd, effect))
            .map_or("> 10,000".into(), |n| n.to_string())
    };
    for p in all {
        let effect = paper_effect(p.baseline);
        let (sd_best, sd_final) = (p.best_diff.sd(), p.final_diff.sd());
        let show = |x: Option<f64>| x.map_or("—".into(), |x| format!("{x:.2}"));
        t.row([
            p.model.clone(),
            p.baseline.paper_name().to_string(),
            p.seeds.len().to_string(),
            show(sd_best),
            show(sd_final),
            show(sd_best.map(|sd| detectable(sd, p.seeds.len()))),
            format!("+{effect}"),
            needed(sd_best, effect),
            needed(sd_final, effect),
        ]);
    }
    let mut s = t.to_string();
    s.push_str(&format!("\nPoints of weighted accuracy. sd: the sample standard deviation of the paired differences (-AC − baseline, seed by seed). Detectable: (t₀.₉₇₅ + t₀.₈₀)·sd/√n, the smallest true gain these n seeds find with 80 % power in a two-sided paired t test at 5 %. Seeds for it: the smallest n with that detectable gain at or below the design's size for the family, assuming the sd stays as measured. The design's sizes are round numbers (+2 points PPO-AC, +1 GRPO-AC); Table 1's smallest gains are +{:.1} and +{:.1} (verdict.md's margins).\n", paper_low_end(AlgorithmKind::Ppo), paper_low_end(AlgorithmKind::Grpo)));
    s
}

/// seeds.md: each matched pair over its seeds.
pub fn markdown(all: &[PairStats]) -> String {
    let mut t = Table::new([
        ("model", Left),
        ("-AC vs", Left),
        ("seeds", Left),
        ("baseline best", Right),
        ("-AC best", Right),
        ("Δ best [95 % CI]", Right),
        ("Δ final [95 % CI]", Right),
        ("-AC reaches the baseline's best", Right),
        ("at step [95 % CI]", Right),
        ("baseline's best step [95 % CI]", Right),
    ]);
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
        t.row([
            p.model.clone(),
            p.baseline.paper_name().into(),
            seeds,
            format!("{:.1}", p.baseline_best),
            format!("{:.1}", p.ac_best),
            p.best_diff.show(1),
            p.final_diff.show(1),
            format!("{} of {}", p.reached, p.seeds.len()),
            p.ac_step.as_ref().map_or("—".into(), steps),
            steps(&p.baseline_step),
        ]);
    }
    let mut s = t.to_string();
    s.push_str(
        "\nWeighted accuracy in points. Δ = (-AC) − (baseline), seed by seed; the interval is Student's t over seeds (n − 1 degrees of freedom). \
         A pair's difference is resolved at 95 % when its interval excludes 0. \
         \"Reaches\": the first evaluation at which the -AC run is at least as good as the same seed's baseline best; descriptive, not a test (it favours the baseline: when the -AC run's best is the lower one it never reaches it; verdict.md tests the steps symmetrically).\n",
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
    fn sample_sizes_match_the_textbook_formula() {
        // sd = effect: the classic paired design needs 10 pairs (8 by the normal
        // approximation (1.96 + 0.84)^2 = 7.85, more with t's heavier tails).
        assert_eq!(seeds_needed(1.0, 1.0), Some(10));
        assert!(detectable(1.0, 10) <= 1.0 && detectable(1.0, 9) > 1.0);
        // twice the noise, four times the seeds (about)
        let n = seeds_needed(2.0, 1.0).expect("n");
        assert!((33..=35).contains(&n), "{n}");
        assert_eq!(seeds_needed(f64::NAN, 1.0), None);
        assert_eq!(seeds_needed(1.0, 0.0), None);
        // the interval's own sd comes back
        let i = Interval::of(&[1.0, 2.0, 4.0, 7.0]).expect("interval");
        let sd = (((1.0f64 - 3.5).powi(2) + 2.25 + 0.25 + 12.25) / 3.0).sqrt();
        assert!((i.sd().expect("sd") - sd).abs() < 1e-12);
        assert!((t_80(1000) - 0.8422).abs() < 1e-3);
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
