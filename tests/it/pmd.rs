//! The theory check (issue #9): exact tabular MDPs, clipped PMD, the theorem bounds and
//! Proposition 1, against closed forms and the statements themselves.

use acpo::pmd::mdp::{solve, Mdp, Policy};
use acpo::pmd::{bound, proposition1, row, run, settings, Setting, StepRule, ALPHAS};

#[test]
fn linear_solve_and_two_state_policy_evaluation_match_closed_forms() {
    let x = solve(vec![2.0, 1.0, 1.0, 3.0], vec![3.0, 5.0]);
    assert!(
        (x[0] - 0.8).abs() < 1e-12 && (x[1] - 1.4).abs() < 1e-12,
        "{x:?}"
    );
    // One action: V = (I − γP)⁻¹ c, written out for two states.
    let (p, q, g, c0, c1) = (0.3, 0.6, 0.9, 0.2, 0.7);
    let m = Mdp {
        states: 2,
        actions: 1,
        gamma: g,
        p: vec![1.0 - p, p, q, 1.0 - q],
        c: vec![c0, c1],
    };
    let v = m.evaluate(&Policy::uniform(2, 1), &[0.0, 0.0]).v;
    let det = (1.0 - g * (1.0 - p)) * (1.0 - g * (1.0 - q)) - g * g * p * q;
    let v0 = ((1.0 - g * (1.0 - q)) * c0 + g * p * c1) / det;
    let v1 = (g * q * c0 + (1.0 - g * (1.0 - p)) * c1) / det;
    assert!((v[0] - v0).abs() < 1e-12 && (v[1] - v1).abs() < 1e-12);
    // Stationary distribution of the chain: ν₀ = q / (p + q).
    let nu = m.stationary(&Policy::uniform(2, 1));
    assert!((nu[0] - q / (p + q)).abs() < 1e-12 && (nu[0] + nu[1] - 1.0).abs() < 1e-12);
}

#[test]
fn advantages_average_to_zero_under_the_policy() {
    let m = Mdp::random(3, 6, 4, 0.8, 2);
    let pi = Policy::uniform(6, 4);
    let vals = m.evaluate(&pi, &[0.0; 6]);
    for s in 0..6 {
        let mean: f64 = (0..4).map(|a| pi.prob(s, a) * vals.a[s * 4 + a]).sum();
        assert!(mean.abs() < 1e-12);
    }
}

#[test]
fn unclipped_pmd_with_a_large_step_converges_to_the_optimal_policy() {
    let m = Mdp::random(11, 15, 4, 0.9, 3);
    let t = run(
        &m,
        Setting {
            alpha: f64::INFINITY,
            eta0: 1e3,
            mu: 0.0,
            rule: StepRule::Fixed,
        },
        30,
    );
    assert!(t.f[0] > 0.1, "the uniform policy is far from optimal");
    assert!(*t.f.last().expect("f") < 1e-9, "F_N = {:?}", t.f.last());
    // F_N is E_ν*[V^π_N − V*] ≥ 0 (up to rounding).
    assert!(t.f.iter().all(|f| *f > -1e-12));
}

#[test]
fn every_measured_gap_stays_under_its_theorem_bound_and_is_monotone() {
    let mut checked = 0;
    for seed in 0..6u64 {
        let m = Mdp::random(100 + seed, 12, 4, 0.85, 3);
        for alpha in ALPHAS {
            for setting in settings(alpha) {
                let t = run(&m, setting, 60);
                let b = bound(&t);
                let r = row(&t, &b, seed);
                assert!(
                    r.holds,
                    "seed {seed} {} α={alpha}: F_N {:?} above bound {:?}",
                    b.part, t.f, b.values
                );
                assert!(r.monotone, "seed {seed} {} α={alpha}: not monotone", b.part);
                if let Some(rho) = b.rho {
                    assert!(
                        rho < 1.0,
                        "{}: ρ = {rho} (the setting must contract)",
                        b.part
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 6 * ALPHAS.len() * 4);
}

#[test]
fn clipping_only_shrinks_steps_and_the_adaptive_rule_never_lowers_eta() {
    let m = Mdp::random(5, 10, 5, 0.9, 3);
    let clipped = run(&m, settings(0.25)[2], 40);
    assert!(clipped.lambda_min[0] < 1.0, "α = 0.25 clips at the start");
    assert!(clipped.eta.windows(2).all(|w| w[1] >= w[0]));
    // Part (iii)'s effective step η_k λ_k(s) is non-decreasing (eq. effective-monotone) and
    // the bound's R_N-free form applies.
    let unclipped = run(&m, settings(f64::INFINITY)[3], 40);
    assert!(unclipped.lambda_min.iter().all(|l| *l == 1.0));
    assert!(unclipped.theta.iter().all(|t| *t == 1.0));
}

#[test]
fn proposition_1_acpo_second_moment_is_at_most_ppo_at_equal_retention() {
    for eps in [0.05, 0.2, 0.4] {
        let p = proposition1(7, 50_000, eps);
        assert!(p.retention > 0.3 && p.retention < 1.0, "{p:?}");
        assert!(
            p.second_moment_acpo <= p.second_moment_ppo,
            "ε = {eps}: {} > {}",
            p.second_moment_acpo,
            p.second_moment_ppo
        );
    }
}
