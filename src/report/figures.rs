//! The paper's figures from `results/` (PNG and SVG, plotters): weighted accuracy vs step per
//! model (Fig. 1), per-benchmark accuracy per model (appendix figures), policy entropy over the
//! first 100 steps (Fig. 2), and r·Â distributions by prompt difficulty (Fig. 3). Every method
//! has one colour everywhere; drawing is [`crate::report::plot`]'s.

use crate::files::AtPath;
use plotters::prelude::RGBColor;
use std::path::{Path, PathBuf};

use super::table::{Align::Left, Align::Right, Table};
use super::{model_order, ReportError, RunResult};
use crate::algo::method::AlgorithmKind;
use crate::data::Benchmark;
use crate::report::plot::{write_figure, Legend, Panel, Series, Ticks, PALETTE};
use crate::run::tails::{Histogram, Tails};
use crate::run::{metric, RunDir};

type Result<T> = std::result::Result<T, ReportError>;

/// One colour per method, in every figure (the sweeps' too): the palette's first four.
pub fn method_color(m: AlgorithmKind) -> RGBColor {
    match m {
        AlgorithmKind::Ppo => PALETTE[0],
        AlgorithmKind::PpoAc => PALETTE[1],
        AlgorithmKind::Grpo => PALETTE[2],
        AlgorithmKind::GrpoAc => PALETTE[3],
    }
}

/// One series per method of `model`: its run's points; with runs of several seeds, the mean
/// at each step every seed has, and the mean's 95 % t interval across seeds as a band.
fn method_series(
    runs: &[RunResult],
    model: &str,
    points: impl Fn(&RunResult) -> Vec<(f64, f64)>,
) -> Vec<Series> {
    let mut out = Vec::new();
    for alg in AlgorithmKind::ALL {
        let of: Vec<&RunResult> = runs
            .iter()
            .filter(|r| r.model == model && r.algorithm == alg)
            .collect();
        let (color, name) = (method_color(alg), alg.paper_name());
        match of.as_slice() {
            [] => {}
            [one] => out.push(Series {
                label: name.into(),
                color,
                points: points(one),
                band: Vec::new(),
            }),
            several => {
                let per: Vec<Vec<(f64, f64)>> = several.iter().map(|r| points(r)).collect();
                let (mut mean, mut band) = (Vec::new(), Vec::new());
                for &(x, _) in &per[0] {
                    let ys: Option<Vec<f64>> = per
                        .iter()
                        .map(|p| p.iter().find(|q| q.0 == x).map(|q| q.1))
                        .collect();
                    if let Some(i) = ys.and_then(|ys| super::seeds::Interval::of(&ys)) {
                        mean.push((x, i.mean));
                        band.push(i.band_at(x));
                    }
                }
                out.push(Series {
                    label: format!("{name} (mean of {} seeds, 95 % CI)", several.len()),
                    color,
                    points: mean,
                    band,
                });
            }
        }
    }
    out
}

fn runs_of<'a>(runs: &'a [RunResult], model: &str) -> Vec<&'a RunResult> {
    let mut v: Vec<&RunResult> = runs.iter().filter(|r| r.model == model).collect();
    v.sort_by_key(|r| AlgorithmKind::ALL.iter().position(|m| *m == r.algorithm));
    v
}

/// Fig. 1: weighted accuracy vs step, one panel per model; and the per-benchmark panels.
pub fn accuracy(runs: &[RunResult], out: &Path) -> Result<Vec<PathBuf>> {
    let models = model_order(runs.iter().map(|r| r.model.clone()));
    let panels: Vec<Panel> = models
        .iter()
        .map(|m| Panel {
            title: m.clone(),
            x_desc: "training step".into(),
            x_ticks: Ticks::Integers,
            y_desc: "weighted accuracy (%)".into(),
            log_y: false,
            series: method_series(runs, m, |r| {
                r.evals
                    .iter()
                    .map(|e| (e.step as f64, 100.0 * e.weighted_accuracy))
                    .collect()
            }),
            ..Panel::default()
        })
        .collect();
    let mut files = write_figure(
        &out.join("accuracy"),
        "Weighted accuracy during training",
        &panels,
        2,
    )?;
    for m in &models {
        let panels: Vec<Panel> = Benchmark::ALL
            .iter()
            .map(|b| Panel {
                title: b.name().into(),
                x_desc: "training step".into(),
                x_ticks: Ticks::Integers,
                y_desc: "Avg@k (%)".into(),
                log_y: false,
                series: method_series(runs, m, |r| {
                    r.evals
                        .iter()
                        .filter_map(|e| {
                            e.benchmarks
                                .iter()
                                .find(|x| x.benchmark == b.name())
                                .map(|x| (e.step as f64, 100.0 * x.avg_at_k))
                        })
                        .collect()
                }),
                ..Panel::default()
            })
            .collect();
        files.extend(write_figure(
            &out.join(format!("accuracy_{}", slug(m))),
            &format!("{m} on benchmarks"),
            &panels,
            2,
        )?);
    }
    Ok(files)
}

/// Fig. 2: policy entropy over the first 100 steps, one panel per model; with several seeds,
/// the mean and its 95 % band, as the accuracy curves.
pub fn entropy(runs: &[RunResult], out: &Path) -> Result<Vec<PathBuf>> {
    let models = model_order(runs.iter().map(|r| r.model.clone()));
    let mut curves = std::collections::BTreeMap::new();
    for r in runs {
        let points: Vec<(f64, f64)> = super::load_metrics(&r.dir)?
            .iter()
            .filter_map(|l| Some((*l.get(metric::STEP)?, *l.get(metric::ENTROPY)?)))
            .filter(|(s, _)| *s <= 100.0)
            .collect();
        curves.insert(r.dir.clone(), points);
    }
    let panels: Vec<Panel> = models
        .iter()
        .map(|m| Panel {
            title: m.clone(),
            x_desc: "training step".into(),
            x_ticks: Ticks::Integers,
            y_desc: "policy entropy (nats)".into(),
            log_y: false,
            series: method_series(runs, m, |r| curves[&r.dir].clone()),
            ..Panel::default()
        })
        .collect();
    Ok(write_figure(
        &out.join("entropy"),
        "Policy entropy (first 100 steps)",
        &panels,
        2,
    )?)
}

/// Sum of a run's tail histograms over all recorded steps, per bucket (easy, medium, hard), and
/// of its prompts per bucket.
pub fn run_tails(dir: &Path) -> Result<Option<([Histogram; 3], [usize; 3])>> {
    let tails_dir = RunDir::at(dir).tails_dir();
    if !tails_dir.exists() {
        return Ok(None);
    }
    let mut sum: [Histogram; 3] = Default::default();
    let mut prompts = [0usize; 3];
    let mut any = false;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&tails_dir)
        .at(&tails_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for f in files {
        let text = crate::files::read_to_string(&f).at(&f)?;
        let t: Tails = serde_json::from_str(&text).map_err(|e| ReportError::Invalid {
            path: f.clone(),
            reason: e.to_string(),
        })?;
        for (acc, h) in sum.iter_mut().zip([&t.easy, &t.medium, &t.hard]) {
            acc.merge(h);
        }
        for (acc, n) in prompts.iter_mut().zip(t.prompts) {
            *acc += n;
        }
        any = true;
    }
    Ok(any.then_some((sum, prompts)))
}

/// The prompt difficulties of Fig. 3, easiest first (the tails' histograms' order).
const DIFFICULTY: [&str; 3] = [
    "easy prompts (70–100 %)",
    "medium prompts (30–70 %)",
    "hard prompts (0–30 %)",
];

/// Fig. 3's panels of one model, one per difficulty: each method's histogram as steps over
/// ±`half`, ±each α marked, its count and tail mass in its label.
fn tail_panels(
    per_method: &[(AlgorithmKind, [Histogram; 3])],
    alphas: &[f64],
    half: f64,
    alpha_of: &dyn Fn(AlgorithmKind) -> f64,
) -> Vec<Panel> {
    DIFFICULTY
        .iter()
        .enumerate()
        .map(|(i, title)| Panel {
            title: title.to_string(),
            x_desc: "r·Â".into(),
            y_desc: "density".into(),
            log_y: true,
            zero_at_axis: true,
            x_range: Some((-half, half)),
            marks: alphas.iter().flat_map(|a| [-a, *a]).collect(),
            // each label carries this panel's counts and tail masses
            legend: Legend::BelowPanel,
            x_ticks: Ticks::Auto,
            error_bars: false,
            series: per_method
                .iter()
                .map(|(alg, h)| Series {
                    label: format!(
                        "{} (n={}, {:.2} % beyond ±{})",
                        alg.paper_name(),
                        h[i].count,
                        100.0 * h[i].tail_mass(alpha_of(*alg)),
                        alpha_of(*alg)
                    ),
                    color: method_color(*alg),
                    points: h[i].steps(-half, half),
                    band: Vec::new(),
                })
                .collect(),
        })
        .collect()
}

/// Fig. 3: the density of r·Â for easy / medium / hard prompts, per method, one figure per
/// model: step histograms (the bins as drawn, log scale), the same x-range in every panel, ±α
/// of the model's -AC runs marked, and each method's token count and tail mass (the share with
/// |r·Â| > α, α of its family's -AC run) in its legend. Also the tail masses as a Markdown table (`tails.md`; empty when
/// no run has tails).
pub fn tails(runs: &[RunResult], out: &Path) -> Result<(Vec<PathBuf>, String)> {
    let mut files = Vec::new();
    let mut table = Table::new([
        ("model", Left),
        ("prompts", Left),
        ("method", Left),
        ("tokens", Right),
        ("share with abs(r·Â) > α", Right),
    ]);
    for m in model_order(runs.iter().map(|r| r.model.clone())) {
        let mut per_method = Vec::new();
        for r in runs_of(runs, &m) {
            if let Some((h, _)) = run_tails(&r.dir)? {
                per_method.push((r.algorithm, h));
            }
        }
        if per_method.is_empty() {
            continue;
        }
        // Each family's α is its -AC run's (PPO with PPO-AC, GRPO with GRPO-AC); 2 where the
        // model has no -AC run.
        let alpha_of = |alg: AlgorithmKind| {
            runs_of(runs, &m)
                .iter()
                .find(|r| {
                    r.algorithm.is_ppo_type() == alg.is_ppo_type() && r.clip.alpha().is_some()
                })
                .and_then(|r| r.clip.alpha())
                .unwrap_or(2.0)
        };
        let mut alphas: Vec<f64> = per_method.iter().map(|(a, _)| alpha_of(*a)).collect();
        alphas.sort_by(f64::total_cmp);
        alphas.dedup();
        let widest = alphas.last().copied().unwrap_or(2.0);
        // One x-range for every panel: ±max(2·α, the |r·Â| holding 99.9 % of every histogram).
        let q = per_method
            .iter()
            .flat_map(|(_, h)| h.iter().map(|h| h.abs_quantile(0.999)))
            .fold(0.0, f64::max);
        let half = ((2.0 * widest).max(q * 1.1) * 2.0).ceil() / 2.0;
        let half = half.min(crate::run::tails::HI);
        let panels = tail_panels(&per_method, &alphas, half, &alpha_of);
        for (i, title) in DIFFICULTY.iter().enumerate() {
            for (alg, h) in &per_method {
                table.row([
                    m.clone(),
                    title.split(' ').next().unwrap_or(title).to_string(),
                    alg.paper_name().into(),
                    h[i].count.to_string(),
                    format!(
                        "{:.3} % (α = {})",
                        100.0 * h[i].tail_mass(alpha_of(*alg)),
                        alpha_of(*alg)
                    ),
                ]);
            }
        }
        files.extend(write_figure(
            &out.join(format!("tails_{}", slug(&m))),
            &format!("r·Â by prompt difficulty, {m} (dashed: ±α)"),
            &panels,
            3,
        )?);
    }
    let table = if table.is_empty() {
        String::new()
    } else {
        table.to_string()
    };
    Ok((files, table))
}

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}
