//! The paper's theory, checkable in seconds (issue #9): policy mirror descent with gradient
//! clipping (Algorithm 1) on exact tabular MDPs, against the bounds of Theorems 1 and 2 (the
//! appendix's Theorem "Convergence of clipped PMD", parts (i)–(iv)), and Proposition 1's
//! second-moment comparison on synthetic samples.
//!
//! Everything is exact (no sampling in the PMD part): policy evaluation is a linear solve. The
//! KL mirror map gives the update in closed form. With λ = λ_k(s) = α / max{α, ‖A^{π_k}(s,·)‖₂}
//! and β = η_k λ, the step argmin_p β[⟨A, p⟩ + h(p)] + KL(p‖π_k) is
//!
//! * h = 0:               π_{k+1}(a|s) ∝ π_k(a|s) · exp(−β A(s,a)) (cost minimisation);
//! * h = μ·KL(p‖π_0):     π_{k+1}(a|s) ∝ (π_k(a|s) · π_0(a|s)^{βμ} · exp(−β A(s,a)))^{1/(1+βμ)}
//!   (stationarity of the Lagrangian; this h is exactly μ-strongly convex relative to KL).
//!
//! κ in part (i) is "a constant with λ_k(s) ≥ κ for all k, s" (Lemma "kappa"); we use the
//! smallest λ_k(s) met on the trajectory, which is what the proof needs and gives the tightest
//! valid bound. Part (iv) uses the measured R_N = Π θ_k of Lemma "variation" (and reports its
//! bound e^{T_0} with K_norm = √|A| for the ℓ2 norm).

pub mod mdp;

use crate::files::{AtPath, PathIoError};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mdp::{Mdp, Policy};
use serde::Serialize;

use crate::algo::clip::PolicyClip;
use crate::report::plot::{tint, write_figure, Panel, PlotError, Series, Ticks, PALETTE};
use crate::report::table::{Align::Left, Table};

/// Why the theory check's outputs could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PmdError {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error("pmd.json: {0}")]
    Json(#[from] serde_json::Error),
}
use crate::rng::SplitMix64;

/// Step-size rule of Algorithm 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum StepRule {
    Fixed,
    /// η_{k+1} = η_k · max{1, max_s λ_k(s)/λ_{k+1}(s)} (eq. adaptive-eta).
    Adaptive,
}

/// One run of clipped PMD.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Setting {
    /// Clipping threshold; `f64::INFINITY` is unclipped PMD.
    pub alpha: f64,
    pub eta0: f64,
    /// Strength of h^p = μ·KL(p‖π_0); 0 is the unregularised problem.
    pub mu: f64,
    pub rule: StepRule,
}

impl Setting {
    /// The theorem part that covers this setting: (i)–(iv).
    pub fn part(&self) -> &'static str {
        match (self.mu > 0.0, self.rule) {
            (true, StepRule::Fixed) => "(i)",
            (true, StepRule::Adaptive) => "(ii)",
            (false, StepRule::Adaptive) => "(iii)",
            (false, StepRule::Fixed) => "(iv)",
        }
    }
}

/// What a run measured, iterate by iterate (index k = 0..=N).
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub setting: Setting,
    /// F_k = E_{ν*}[V^{π_k} − V^{π*}].
    pub f: Vec<f64>,
    /// E_{ν*}[KL(π*‖π_k)].
    pub d: Vec<f64>,
    /// η_k.
    pub eta: Vec<f64>,
    /// min_s λ_k(s).
    pub lambda_min: Vec<f64>,
    /// θ_k of Lemma "variation" (k = 0..N−1).
    pub theta: Vec<f64>,
    /// E_{ν*}[D_0(s) / (η_0 λ_0(s))].
    pub d0_weighted: f64,
    /// Σ_s e_0(s) (for T_0).
    pub e0_sum: f64,
    /// Largest increase of any V^{π_k}(s) from one iterate to the next (≤ 0 up to rounding
    /// by Lemma "monotonicity").
    pub max_value_increase: f64,
    pub actions: usize,
    pub gamma: f64,
}

fn h_of(pi: &Policy, states: usize, mu: f64) -> Vec<f64> {
    let na = pi.actions;
    let uniform = Policy::uniform(states, na);
    (0..states).map(|s| mu * uniform.kl_from(pi, s)).collect()
}

/// Runs `n` iterations of Algorithm 1 from the uniform policy.
pub fn run(m: &Mdp, setting: Setting, n: usize) -> Trace {
    let (ns, na) = (m.states, m.actions);
    let mu = setting.mu;
    let star = m.optimal(mu);
    let nu = m.stationary(&star);
    let v_star = m.evaluate(&star, &h_of(&star, ns, mu)).v;
    let log_uniform = -(na as f64).ln();
    let lambda_of = |adv: &[f64]| -> Vec<f64> {
        (0..ns)
            .map(|s| {
                let norm = adv[s * na..(s + 1) * na]
                    .iter()
                    .map(|x| x * x)
                    .sum::<f64>()
                    .sqrt();
                if setting.alpha.is_finite() {
                    setting.alpha / setting.alpha.max(norm)
                } else {
                    1.0
                }
            })
            .collect()
    };
    let mut pi = Policy::uniform(ns, na);
    let mut values = m.evaluate(&pi, &h_of(&pi, ns, mu));
    let mut lambda = lambda_of(&values.a);
    let mut eta = setting.eta0;
    let expect = |x: &dyn Fn(usize) -> f64| (0..ns).map(|s| nu[s] * x(s)).sum::<f64>();
    let mut trace = Trace {
        setting,
        f: Vec::with_capacity(n + 1),
        d: Vec::with_capacity(n + 1),
        eta: Vec::with_capacity(n + 1),
        lambda_min: Vec::with_capacity(n + 1),
        theta: Vec::with_capacity(n),
        d0_weighted: expect(&|s| pi.kl_from(&star, s) / (setting.eta0 * lambda[s])),
        e0_sum: (0..ns).map(|s| values.v[s] - v_star[s]).sum(),
        max_value_increase: f64::NEG_INFINITY,
        actions: na,
        gamma: m.gamma,
    };
    for k in 0..=n {
        trace.f.push(expect(&|s| values.v[s] - v_star[s]));
        trace.d.push(expect(&|s| pi.kl_from(&star, s)));
        trace.eta.push(eta);
        trace
            .lambda_min
            .push(lambda.iter().copied().fold(f64::INFINITY, f64::min));
        if k == n {
            break;
        }
        // The closed-form step, in log space.
        let mut next = pi.clone();
        for (s, lam) in lambda.iter().enumerate() {
            let beta = eta * lam;
            let row: Vec<f64> = (0..na)
                .map(|a| {
                    let i = s * na + a;
                    (pi.log_p[i] + beta * mu * log_uniform - beta * values.a[i]) / (1.0 + beta * mu)
                })
                .collect();
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            for (a, x) in row.iter().enumerate() {
                next.log_p[s * na + a] = x - lse;
            }
        }
        let next_values = m.evaluate(&next, &h_of(&next, ns, mu));
        let next_lambda = lambda_of(&next_values.a);
        for s in 0..ns {
            trace.max_value_increase = trace.max_value_increase.max(next_values.v[s] - values.v[s]);
        }
        // θ_k = max{1, max_s r_{k+1}(s)/r_k(s)} with r = 1/λ (Lemma "variation"); it is also
        // the adaptive rule's factor: η_{k+1} = η_k · max{1, max_s λ_k(s)/λ_{k+1}(s)}.
        let theta = (0..ns)
            .map(|s| lambda[s] / next_lambda[s])
            .fold(1.0, f64::max);
        trace.theta.push(theta);
        if setting.rule == StepRule::Adaptive {
            eta *= theta;
        }
        pi = next;
        values = next_values;
        lambda = next_lambda;
    }
    trace
}

/// The theorem's bound on F_N for N = 0..=n (index N), and for parts (i)/(ii) whether the
/// bound contracts (ρ < 1).
#[derive(Debug, Clone, Serialize)]
pub struct Bound {
    pub part: &'static str,
    pub values: Vec<f64>,
    /// ρ of parts (i)/(ii); R_N-free parts have none.
    pub rho: Option<f64>,
    /// Part (iv): e^{T_0}, the a-priori bound on R_N.
    pub r_bound: Option<f64>,
    pub kappa: f64,
}

/// Evaluates the bound that covers `t`'s setting.
pub fn bound(t: &Trace) -> Bound {
    let s = &t.setting;
    let log_a = (t.actions as f64).ln();
    let (g, f0, n) = (t.gamma, t.f[0], t.f.len() - 1);
    let kappa = t.lambda_min.iter().copied().fold(f64::INFINITY, f64::min);
    let kappa0 = t.lambda_min[0];
    let mut rho = None;
    let mut r_bound = None;
    let values: Vec<f64> = match s.part() {
        "(i)" => {
            let r = g.max(1.0 / (kappa * (1.0 + s.eta0 * s.mu)));
            rho = Some(r);
            (0..=n)
                .map(|k| r.powi(k as i32) * (f0 + (s.mu + 1.0 / s.eta0) * log_a))
                .collect()
        }
        "(ii)" => {
            let r = g.max(1.0 / (1.0 + s.mu * s.eta0 * kappa0));
            rho = Some(r);
            (0..=n)
                .map(|k| r.powi(k as i32) * (f0 + (s.mu + 1.0 / (s.eta0 * kappa0)) * log_a))
                .collect()
        }
        "(iii)" => (0..=n)
            .map(|k| {
                if k == 0 {
                    f64::INFINITY
                } else {
                    (g * f0 + log_a / (s.eta0 * kappa0)) / ((1.0 - g) * k as f64)
                }
            })
            .collect(),
        _ => {
            let k_norm = (t.actions as f64).sqrt();
            r_bound = Some(if s.alpha.is_finite() {
                (k_norm / s.alpha * t.e0_sum).exp()
            } else {
                1.0
            });
            let mut r_n = 1.0;
            (0..=n)
                .map(|k| {
                    if k == 0 {
                        return f64::INFINITY;
                    }
                    r_n *= t.theta[k - 1];
                    r_n * (g * f0 + t.d0_weighted) / ((1.0 - g) * k as f64)
                })
                .collect()
        }
    };
    Bound {
        part: s.part(),
        values,
        rho,
        r_bound,
        kappa,
    }
}

/// Absolute slack for rounding when comparing F_N with a bound or checking monotonicity.
pub const TOLERANCE: f64 = 1e-10;

/// One row of the report: a setting on one MDP.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub part: &'static str,
    pub mdp_seed: u64,
    pub alpha: f64,
    pub eta0: f64,
    pub mu: f64,
    pub f0: f64,
    pub f_n: f64,
    pub bound_n: f64,
    /// max over N ≥ 1 of F_N / bound_N (≤ 1 when every bound holds).
    pub worst_ratio: f64,
    pub holds: bool,
    pub monotone: bool,
    pub kappa: f64,
    pub rho: Option<f64>,
    pub final_eta: f64,
}

pub fn row(t: &Trace, b: &Bound, mdp_seed: u64) -> Row {
    let n = t.f.len() - 1;
    let mut worst = 0f64;
    let mut holds = true;
    for k in 1..=n {
        if t.f[k] > b.values[k] + TOLERANCE {
            holds = false;
        }
        if b.values[k].is_finite() && b.values[k] > 0.0 {
            worst = worst.max(t.f[k].max(0.0) / b.values[k]);
        }
    }
    let monotone =
        t.f.windows(2).all(|w| w[1] <= w[0] + TOLERANCE) && t.max_value_increase <= TOLERANCE;
    Row {
        part: b.part,
        mdp_seed,
        alpha: t.setting.alpha,
        eta0: t.setting.eta0,
        mu: t.setting.mu,
        f0: t.f[0],
        f_n: t.f[n],
        bound_n: b.values[n],
        worst_ratio: worst,
        holds,
        monotone,
        kappa: b.kappa,
        rho: b.rho,
        final_eta: *t.eta.last().unwrap_or(&t.setting.eta0),
    }
}

/// Proposition 1 on synthetic samples: PPO's and ACPO's retained second moments at equal
/// retention probability.
#[derive(Debug, Clone, Serialize)]
pub struct Prop1 {
    pub eps: f64,
    /// P(retained) under the PPO rule, matched by ACPO's α.
    pub retention: f64,
    pub alpha: f64,
    pub second_moment_acpo: f64,
    pub second_moment_ppo: f64,
}

/// Samples r = exp(σ z₁), Â = z₂·exp(z₃/2) (heavy tails), ‖∇log π‖² = exp(z₄) independent of
/// (r, Â) (the proposition's conditional-constant assumption); PPO keeps a sample's gradient
/// unless its ratio is clipped on the side its advantage pushes; ACPO keeps |r·Â| ≤ α with α
/// the quantile that matches PPO's retention probability.
pub fn proposition1(seed: u64, samples: usize, eps: f64) -> Prop1 {
    let mut rng = SplitMix64::from_key(&[seed, 0x9401]);
    let mut rows = Vec::with_capacity(samples);
    for _ in 0..samples {
        let r = (0.3 * rng.next_normal()).exp();
        let a = rng.next_normal() * (0.5 * rng.next_normal()).exp();
        let g2 = rng.next_normal().exp();
        rows.push((r, a, g2));
    }
    // the ratio clip as the proposition states it: symmetric, no dual clip
    let ratio_clip = PolicyClip::Ratio {
        eps_low: eps,
        eps_high: eps,
        dual_clip_c: f64::INFINITY,
    };
    let kept = rows
        .iter()
        .filter(|(r, a, _)| ratio_clip.retains(*r, *a))
        .count();
    let mut mags: Vec<f64> = rows.iter().map(|(r, a, _)| (r * a).abs()).collect();
    mags.sort_by(f64::total_cmp);
    let alpha = if kept == 0 { 0.0 } else { mags[kept - 1] };
    let advantage_clip = PolicyClip::Advantage { alpha };
    let (mut acpo, mut ppo) = (0f64, 0f64);
    for (r, a, g2) in &rows {
        let m = (r * a) * (r * a) * g2;
        if advantage_clip.retains(*r, *a) {
            acpo += m;
        }
        if ratio_clip.retains(*r, *a) {
            ppo += m;
        }
    }
    Prop1 {
        eps,
        retention: kept as f64 / samples as f64,
        alpha,
        second_moment_acpo: acpo / samples as f64,
        second_moment_ppo: ppo / samples as f64,
    }
}

/// The experiment `acpo pmd` runs: random MDPs × thresholds × the four theorem parts.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub seed: u64,
    pub mdps: u64,
    pub states: usize,
    pub actions: usize,
    pub gamma: f64,
    pub iterations: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 0,
            mdps: 5,
            states: 20,
            actions: 5,
            gamma: 0.9,
            iterations: 100,
        }
    }
}

/// Thresholds compared (∞ is unclipped PMD).
pub const ALPHAS: [f64; 4] = [0.25, 0.5, 1.0, f64::INFINITY];

/// The four settings of Theorems 1–2 at threshold `alpha`: strongly convex (μ = 0.5, η = 20,
/// so that ημ > 1/κ − 1 for the thresholds above: ρ < 1) and unregularised (η = 1, slow enough to
/// show the O(1/N) regime), each with a fixed and an adaptive step.
pub fn settings(alpha: f64) -> [Setting; 4] {
    [
        Setting {
            alpha,
            eta0: 20.0,
            mu: 0.5,
            rule: StepRule::Fixed,
        },
        Setting {
            alpha,
            eta0: 20.0,
            mu: 0.5,
            rule: StepRule::Adaptive,
        },
        Setting {
            alpha,
            eta0: 1.0,
            mu: 0.0,
            rule: StepRule::Adaptive,
        },
        Setting {
            alpha,
            eta0: 1.0,
            mu: 0.0,
            rule: StepRule::Fixed,
        },
    ]
}

/// Everything `acpo pmd` computed.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
    pub prop1: Vec<Prop1>,
    pub files: Vec<PathBuf>,
}

impl Report {
    pub fn all_hold(&self) -> bool {
        self.rows.iter().all(|r| r.holds && r.monotone)
            && self
                .prop1
                .iter()
                .all(|p| p.second_moment_acpo <= p.second_moment_ppo)
    }

    /// One line: how many runs stay under their bound, and Proposition 1's count.
    pub fn summary(&self) -> String {
        let held = self.rows.iter().filter(|r| r.holds && r.monotone).count();
        let prop1 = self
            .prop1
            .iter()
            .filter(|p| p.second_moment_acpo <= p.second_moment_ppo)
            .count();
        format!(
            "{held} of {} runs stay under their theorem bound with monotone F_N; Proposition 1 holds for {prop1} of {} clip ranges",
            self.rows.len(),
            self.prop1.len()
        )
    }
}

fn fmt_alpha(a: f64) -> String {
    if a.is_finite() {
        format!("{a}")
    } else {
        "∞".into()
    }
}

/// Runs the whole check and writes `pmd.md`, `pmd.json` and the figure `pmd.png`/`.svg` to `out`.
pub fn report(cfg: &Config, out: &Path) -> Result<Report, PmdError> {
    let mut rows = Vec::new();
    let mut panels: Vec<Panel> = Vec::new();
    let colors = [PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[7]];
    for i in 0..cfg.mdps {
        let seed = cfg.seed.wrapping_add(i);
        let m = Mdp::random(seed, cfg.states, cfg.actions, cfg.gamma, 3);
        for (ai, &alpha) in ALPHAS.iter().enumerate() {
            for (pi, setting) in settings(alpha).into_iter().enumerate() {
                let t = run(&m, setting, cfg.iterations);
                let b = bound(&t);
                rows.push(row(&t, &b, seed));
                if i == 0 {
                    if panels.len() <= pi {
                        panels.push(Panel {
                            title: format!(
                                "{} {}, μ={}, η₀={}",
                                setting.part(),
                                match setting.rule {
                                    StepRule::Fixed => "fixed η",
                                    StepRule::Adaptive => "adaptive η",
                                },
                                setting.mu,
                                setting.eta0
                            ),
                            x_desc: "iteration N".into(),
                            x_ticks: Ticks::Integers,
                            y_desc: "F(N) (dark), its bound (light)".into(),
                            log_y: true,
                            series: Vec::new(),
                            ..Panel::default()
                        });
                    }
                    let c = colors[ai];
                    let light = tint(c, 2.0 / 3.0);
                    let pts = |v: &[f64]| -> Vec<(f64, f64)> {
                        v.iter()
                            .enumerate()
                            .filter(|(_, y)| y.is_finite() && **y > 1e-15)
                            .map(|(k, y)| (k as f64, *y))
                            .collect()
                    };
                    panels[pi].series.push(Series {
                        label: format!("F(N), α={}", fmt_alpha(alpha)),
                        color: c,
                        points: pts(&t.f),
                        band: Vec::new(),
                    });
                    panels[pi].series.push(Series {
                        label: format!("bound, α={}", fmt_alpha(alpha)),
                        color: light,
                        points: pts(&b.values),
                        band: Vec::new(),
                    });
                }
            }
        }
    }
    let prop1: Vec<Prop1> = [0.1, 0.2, 0.28]
        .iter()
        .map(|&eps| proposition1(cfg.seed, 200_000, eps))
        .collect();
    std::fs::create_dir_all(out).at(out)?;
    let mut files = write_figure(
        &out.join("pmd"),
        "Clipped policy mirror descent: F(N) against Theorems 1–2",
        &panels,
        2,
    )?;
    let md = markdown(cfg, &rows, &prop1);
    let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, PmdError> {
        let path = out.join(name);
        crate::atomic::write(&path, bytes)?;
        Ok(path)
    };
    files.push(write("pmd.md", md.as_bytes())?);
    let json = serde_json::json!({ "config": {
        "seed": cfg.seed, "mdps": cfg.mdps, "states": cfg.states, "actions": cfg.actions,
        "gamma": cfg.gamma, "iterations": cfg.iterations }, "rows": rows, "proposition1": prop1 });
    let text = serde_json::to_string_pretty(&json)?;
    files.push(write("pmd.json", text.as_bytes())?);
    Ok(Report { rows, prop1, files })
}

/// The theorems' table: one row per part and (α, μ, η₀), over its MDPs.
fn theorem_table(rows: &[Row]) -> Table {
    let mut table = Table::new(
        [
            "part",
            "α",
            "μ",
            "η₀",
            "runs",
            "max F_0",
            "max F_N",
            "min bound_N",
            "worst F/bound",
            "κ (min)",
            "ρ (max)",
            "holds",
            "monotone",
        ]
        .map(|h| (h, Left)),
    );
    let mut keys: Vec<(&str, String, String, String)> = Vec::new();
    for r in rows {
        let k = (
            r.part,
            fmt_alpha(r.alpha),
            format!("{}", r.mu),
            format!("{}", r.eta0),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for k in keys {
        let group: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                (
                    r.part,
                    fmt_alpha(r.alpha),
                    format!("{}", r.mu),
                    format!("{}", r.eta0),
                ) == k
            })
            .collect();
        let max =
            |f: &dyn Fn(&Row) -> f64| group.iter().map(|r| f(r)).fold(f64::NEG_INFINITY, f64::max);
        let min =
            |f: &dyn Fn(&Row) -> f64| group.iter().map(|r| f(r)).fold(f64::INFINITY, f64::min);
        let rho = max(&|r| r.rho.unwrap_or(f64::NEG_INFINITY));
        let yes = |all: bool| if all { "yes" } else { "**NO**" }.to_string();
        table.row([
            k.0.to_string(),
            k.1,
            k.2,
            k.3,
            group.len().to_string(),
            format!("{:.3e}", max(&|r| r.f0)),
            format!("{:.3e}", max(&|r| r.f_n)),
            format!("{:.3e}", min(&|r| r.bound_n)),
            format!("{:.3}", max(&|r| r.worst_ratio)),
            format!("{:.3}", min(&|r| r.kappa)),
            if rho.is_finite() {
                format!("{rho:.3}")
            } else {
                "–".into()
            },
            yes(group.iter().all(|r| r.holds)),
            yes(group.iter().all(|r| r.monotone)),
        ]);
    }
    table
}

fn markdown(cfg: &Config, rows: &[Row], prop1: &[Prop1]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Clipped policy mirror descent vs Theorems 1-2\n\n{} random MDPs (|S| = {}, |A| = {}, γ = {}, \
         seeds {}..{}), {} iterations from the uniform policy, exact policy evaluation. \
         F_N = E_ν*[V^π_N − V^π*]; the bound is the theorem part's right-hand side at N. \
         \"worst\" is max_N F_N / bound_N over N ≥ 1 (≤ 1 when the bound holds at every N); \
         \"monotone\": F_N and every V^π_N(s) non-increasing (Lemma monotonicity).\n",
        cfg.mdps,
        cfg.states,
        cfg.actions,
        cfg.gamma,
        cfg.seed,
        // the MDPs' seeds wrap past u64::MAX, as they are drawn
        cfg.seed.wrapping_add(cfg.mdps.saturating_sub(1)),
        cfg.iterations
    );
    s.push_str(&theorem_table(rows).to_string());
    let _ = writeln!(
        s,
        "\n## Proposition 1\n\n200,000 synthetic (r, Â, ‖∇log π‖²) samples; ACPO's α is set so that \
         P(|r·Â| ≤ α) equals PPO's retention probability.\n"
    );
    let mut table = Table::new(
        [
            "ε (PPO)",
            "retention",
            "matched α",
            "E‖G_ACPO‖²",
            "E‖G_PPO‖²",
            "ACPO ≤ PPO",
        ]
        .map(|h| (h, Left)),
    );
    for p in prop1 {
        table.row([
            p.eps.to_string(),
            format!("{:.4}", p.retention),
            format!("{:.4}", p.alpha),
            format!("{:.5}", p.second_moment_acpo),
            format!("{:.5}", p.second_moment_ppo),
            if p.second_moment_acpo <= p.second_moment_ppo {
                "yes"
            } else {
                "**NO**"
            }
            .to_string(),
        ]);
    }
    s.push_str(&table.to_string());
    s
}
