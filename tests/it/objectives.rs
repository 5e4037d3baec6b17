//! src/algo against an independent reference: `tools/oracles/ref_objectives.py` (numpy, float64,
//! textbook min/max/clip form of verl's formulas) wrote `tests/fixtures/objectives.json`.
//! Rerun it with `python3 tools/oracles/ref_objectives.py > tests/fixtures/objectives.json`.

use acpo::algo::clip::PolicyClip;
use acpo::algo::method::LossAggMode;
use acpo::algo::{advantage, clip, loss, token};
use candle_core::{Device, Tensor, Var};
use serde_json::Value;

const MODES: [(&str, LossAggMode); 5] = [
    ("token-mean", LossAggMode::TokenMean),
    ("token-mean-microbatch", LossAggMode::TokenMeanMicrobatch),
    ("seq-mean-token-sum", LossAggMode::SeqMeanTokenSum),
    ("seq-mean-token-mean", LossAggMode::SeqMeanTokenMean),
    ("seq-mean-token-sum-norm", LossAggMode::SeqMeanTokenSumNorm),
];

fn fixture() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/objectives.json"
    ))
    .expect("fixture present");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn rows(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect()
        })
        .collect()
}

fn tensor(v: &Value) -> Tensor {
    let r = rows(v);
    let (b, t) = (r.len(), r[0].len());
    Tensor::from_vec(
        r.into_iter().flatten().collect::<Vec<_>>(),
        (b, t),
        &Device::Cpu,
    )
    .expect("tensor")
}

fn host(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().expect("2-D f32")
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

fn assert_rows_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f64, what: &str) {
    for (b, (g, w)) in got.iter().zip(want).enumerate() {
        for (t, (x, y)) in g.iter().zip(w).enumerate() {
            assert!(
                close(*x as f64, *y as f64, tol),
                "{what}[{b}][{t}]: got {x}, reference {y}"
            );
        }
    }
}

fn clip_of(v: &Value) -> PolicyClip {
    let eps = |k: &str| v[k].as_f64().expect(k);
    match v["kind"].as_str().expect("kind") {
        "ratio" => PolicyClip::Ratio {
            eps_low: eps("eps_low"),
            eps_high: eps("eps_high"),
            dual_clip_c: eps("dual_clip_c"),
        },
        "cispo" => PolicyClip::Cispo {
            eps_low: eps("eps_low"),
            eps_high: eps("eps_high"),
        },
        "gspo" => PolicyClip::Gspo {
            eps_low: eps("eps_low"),
            eps_high: eps("eps_high"),
        },
        "unclipped" => PolicyClip::Unclipped,
        "advantage" => PolicyClip::Advantage {
            alpha: eps("alpha"),
        },
        other => panic!("unknown clip kind {other} in the fixture"),
    }
}

struct Batch {
    mask: Tensor,
    log_prob: Tensor,
    old: Tensor,
    adv: Tensor,
    micro: Vec<(usize, usize)>,
    horizon: usize,
}

fn batch(f: &Value) -> Batch {
    let i = &f["inputs"];
    Batch {
        mask: tensor(&i["mask"]),
        log_prob: tensor(&i["log_prob"]),
        old: tensor(&i["old_log_prob"]),
        adv: tensor(&i["advantages"]),
        micro: i["micro_batches"]
            .as_array()
            .expect("micro")
            .iter()
            .map(|p| {
                (
                    p[0].as_u64().expect("lo") as usize,
                    p[1].as_u64().expect("hi") as usize,
                )
            })
            .collect(),
        horizon: i["horizon"].as_u64().expect("horizon") as usize,
    }
}

/// The mini-batch policy loss as the trainer computes it: the sum of micro-batch shares.
fn minibatch_policy_loss(
    bt: &Batch,
    lp: &Tensor,
    clip: &PolicyClip,
    mode: LossAggMode,
) -> (Tensor, clip::PolicyStats) {
    let agg = loss::Aggregation::new(mode, &bt.mask, bt.micro.len(), bt.horizon).expect("agg");
    let mut total: Option<Tensor> = None;
    let mut stats = clip::PolicyStats::default();
    for &(lo, hi) in &bt.micro {
        let n = hi - lo;
        let out = loss::policy_loss(
            clip,
            &lp.narrow(0, lo, n).expect("narrow"),
            &bt.old.narrow(0, lo, n).expect("narrow"),
            &bt.adv.narrow(0, lo, n).expect("narrow"),
            &bt.mask.narrow(0, lo, n).expect("narrow"),
            &agg,
        )
        .expect("policy loss");
        stats = stats.merge(&out.stats);
        total = Some(match total {
            None => out.loss,
            Some(t) => (t + out.loss).expect("add"),
        });
    }
    (total.expect("at least one micro-batch"), stats)
}

#[test]
fn policy_losses_match_the_reference_for_every_clip_and_aggregation() {
    let f = fixture();
    let bt = batch(&f);
    for case in f["policy"].as_array().expect("policy cases") {
        let clip = clip_of(&case["clip"]);
        for (name, mode) in MODES {
            let (got, stats) = minibatch_policy_loss(&bt, &bt.log_prob, &clip, mode);
            let got = got.to_scalar::<f32>().expect("scalar") as f64;
            let want = case["loss"][name].as_f64().expect("loss");
            assert!(
                close(got, want, 1e-5),
                "{clip:?} {name}: loss {got}, reference {want}"
            );
            let s = &case["stats"];
            for (key, value) in [
                ("ppo_kl", stats.ppo_kl),
                ("pg_clipfrac", stats.pg_clipfrac),
                ("pg_clipfrac_lower", stats.pg_clipfrac_lower),
                ("acpo_clipfrac_upper", stats.acpo_clipfrac_upper),
                ("acpo_clipfrac_lower", stats.acpo_clipfrac_lower),
                ("ratio_adv_mean", stats.ratio_adv_mean),
                ("ratio_adv_abs_max", stats.ratio_adv_abs_max),
            ] {
                let w = s[key].as_f64().expect("stat");
                assert!(
                    close(value, w, 1e-5),
                    "{clip:?} {key}: {value}, reference {w}"
                );
            }
        }
        let agg =
            loss::Aggregation::whole(LossAggMode::TokenMean, &bt.mask, bt.horizon).expect("agg");
        let out =
            loss::policy_loss(&clip, &bt.log_prob, &bt.old, &bt.adv, &bt.mask, &agg).expect("loss");
        assert_rows_close(
            &host(&out.per_token),
            &rows(&case["per_token"]),
            1e-5,
            "per_token",
        );
    }
}

#[test]
fn the_reference_exercises_every_branch() {
    // A fixture where some clip never fires would let a wrong branch pass unnoticed.
    let f = fixture();
    let stat = |i: usize, k: &str| f["policy"][i]["stats"][k].as_f64().expect("stat");
    assert!(stat(0, "pg_clipfrac") > 0.0 && stat(0, "pg_clipfrac_lower") > 0.0);
    assert!(
        stat(0, "pg_clipfrac") > stat(1, "pg_clipfrac"),
        "ε_high must matter"
    );
    assert!(stat(3, "acpo_clipfrac_upper") > 0.0 && stat(3, "acpo_clipfrac_lower") > 0.0);
    // Issue #23's family: CISPO clips some weights and not others; GSPO keeps some sequences
    // inside its bounds at ε 0.2/0.28 and clips more at its published 3e-4/4e-4.
    let kind = |i: usize| {
        f["policy"][i]["clip"]["kind"]
            .as_str()
            .expect("kind")
            .to_string()
    };
    assert_eq!(
        (5..9).map(kind).collect::<Vec<_>>(),
        ["cispo", "gspo", "gspo", "unclipped"]
    );
    assert!(stat(5, "pg_clipfrac") > 0.0 && stat(5, "pg_clipfrac") < 1.0);
    assert!(stat(6, "pg_clipfrac") > 0.0 && stat(7, "pg_clipfrac") > stat(6, "pg_clipfrac"));
    assert_eq!(stat(8, "pg_clipfrac"), 0.0);
    assert!(f["value"][0]["clipfrac"].as_f64().expect("clipfrac") > 0.0);
}

/// Each rule's gradient mask ([`PolicyClip::terms`], what the regime diagnostic compares) is
/// where the reference's gradient flows: 1 on a valid token exactly where d loss / d log π is
/// not 0, else 0.
#[test]
fn every_rules_gradient_mask_is_where_its_gradient_flows() {
    let f = fixture();
    let bt = batch(&f);
    let tokens = clip::Tokens::new(&bt.log_prob, &bt.old, &bt.adv, &bt.mask).expect("tokens");
    let mask = host(&bt.mask);
    for case in f["policy"].as_array().expect("policy cases") {
        let rule = clip_of(&case["clip"]);
        let keep = host(&rule.terms(&tokens).expect("terms").keep);
        let grad = rows(&case["per_token_grad"]);
        for (b, m) in mask.iter().enumerate() {
            for (t, _) in m.iter().enumerate().filter(|(_, &m)| m != 0.0) {
                assert!(keep[b][t] == 0.0 || keep[b][t] == 1.0, "{rule:?}: {keep:?}");
                assert_eq!(
                    keep[b][t] == 1.0,
                    grad[b][t] != 0.0,
                    "{rule:?} [{b}][{t}]: keep {}, reference gradient {}",
                    keep[b][t],
                    grad[b][t]
                );
            }
        }
    }
}

/// Each rule's keep rule as Proposition 1 counts it ([`PolicyClip::retains`]) is its gradient
/// mask ([`PolicyClip::terms`]) on every token with Â ≠ 0 (Â = 0 has no gradient to keep),
/// with GSPO's ratio the sequence's.
#[test]
fn every_rules_keep_rule_is_its_gradient_mask() {
    let (b, t) = (6usize, 9usize);
    let mut rng = acpo::rng::SplitMix64::new(61);
    let mut draw = |lo: f64, hi: f64| -> Vec<f32> {
        (0..b * t)
            .map(|_| (lo + (hi - lo) * rng.next_f64()) as f32)
            .collect()
    };
    // log-ratios in [−1.6, 1.6]: ratios from 0.2 to 5, across every bound below
    let old = draw(-3.0, -0.5);
    let lp: Vec<f32> = old
        .iter()
        .zip(draw(-1.6, 1.6))
        .map(|(o, d)| o + d)
        .collect();
    let adv: Vec<f32> = draw(-2.0, 2.0)
        .into_iter()
        .map(|a| if a == 0.0 { 0.5 } else { a })
        .collect();
    let mask: Vec<f32> = (0..b * t)
        .map(|i| f32::from(u8::from(i % t < t - i / t)))
        .collect();
    let tensor = |v: &[f32]| Tensor::from_vec(v.to_vec(), (b, t), &Device::Cpu).expect("t");
    let tokens = clip::Tokens::new(&tensor(&lp), &tensor(&old), &tensor(&adv), &tensor(&mask))
        .expect("tokens");
    let rules = [
        PolicyClip::Ratio {
            eps_low: 0.2,
            eps_high: 0.28,
            dual_clip_c: 3.0,
        },
        PolicyClip::Advantage { alpha: 1.0 },
        PolicyClip::Cispo {
            eps_low: 0.2,
            eps_high: 0.28,
        },
        PolicyClip::Gspo {
            eps_low: 0.1,
            eps_high: 0.1,
        },
        PolicyClip::Unclipped,
    ];
    let (mut kept, mut dropped) = (0, 0);
    for rule in rules {
        let keep = host(&rule.terms(&tokens).expect("terms").keep);
        for row in 0..b {
            let valid: Vec<usize> = (0..t).filter(|&j| mask[row * t + j] != 0.0).collect();
            let log_ratio = |j: usize| f64::from(lp[row * t + j] - old[row * t + j]);
            let sequence_ratio =
                (valid.iter().map(|&j| log_ratio(j)).sum::<f64>() / valid.len() as f64).exp();
            for &j in &valid {
                let r = match rule {
                    PolicyClip::Gspo { .. } => sequence_ratio,
                    _ => log_ratio(j).exp(),
                };
                let retains = rule.retains(r, f64::from(adv[row * t + j]));
                assert_eq!(
                    keep[row][j] == 1.0,
                    retains,
                    "{rule:?} [{row}][{j}]: r {r}, Â {}",
                    adv[row * t + j]
                );
                if retains {
                    kept += 1;
                } else {
                    dropped += 1;
                }
            }
        }
    }
    assert!(kept > 20 && dropped > 20, "kept {kept}, dropped {dropped}");
}

/// d(Σ per-token loss)/d log π, token by token, must be the reference's −r·Â on kept tokens and
/// exactly 0 on clipped ones.
#[test]
fn per_token_policy_gradients_match_the_reference_and_clipped_tokens_get_exactly_zero() {
    let f = fixture();
    let bt = batch(&f);
    for case in f["policy"].as_array().expect("policy cases") {
        let clip = clip_of(&case["clip"]);
        let lp = Var::from_tensor(&bt.log_prob).expect("var");
        // seq-mean-token-sum over one sequence per row and B rows = Σ / B; rescale to a pure sum.
        let agg = loss::Aggregation::whole(LossAggMode::SeqMeanTokenSum, &bt.mask, bt.horizon)
            .expect("agg");
        let out = loss::policy_loss(&clip, lp.as_tensor(), &bt.old, &bt.adv, &bt.mask, &agg)
            .expect("loss");
        let b = bt.mask.dim(0).expect("B") as f64;
        let grads = (out.loss * b).expect("scale").backward().expect("backward");
        let g = host(grads.get(lp.as_tensor()).expect("log_prob has a gradient"));
        let want = rows(&case["per_token_grad"]);
        assert_rows_close(&g, &want, 1e-5, "dL/dlogπ");
        for (gr, wr) in g.iter().zip(&want) {
            for (x, y) in gr.iter().zip(wr) {
                if *y == 0.0 {
                    assert_eq!(
                        *x, 0.0,
                        "a clipped or padding token must get exactly zero gradient"
                    );
                }
            }
        }
    }
}

/// Central finite differences of the aggregated loss agree with autograd for every mode, away
/// from the kinks of the clipping functions.
#[test]
fn policy_gradients_agree_with_finite_differences() {
    let f = fixture();
    let bt = batch(&f);
    let base = host(&bt.log_prob);
    let mask = host(&bt.mask);
    let old = host(&bt.old);
    let adv = host(&bt.adv);
    let h = 1e-3f32;
    for case in f["policy"].as_array().expect("policy cases") {
        let clip = clip_of(&case["clip"]);
        // CISPO's and GSPO's gradients are, by design, not those of their loss values (a
        // detached weight; a sequence ratio differentiated through the token's own log π
        // only): the reference's per-token gradients check them instead.
        if matches!(clip, PolicyClip::Cispo { .. } | PolicyClip::Gspo { .. }) {
            continue;
        }
        for (name, mode) in MODES {
            let lp = Var::from_tensor(&bt.log_prob).expect("var");
            let (l, _) = minibatch_policy_loss(&bt, lp.as_tensor(), &clip, mode);
            let g = host(
                l.backward()
                    .expect("backward")
                    .get(lp.as_tensor())
                    .expect("grad"),
            );
            for b in 0..mask.len() {
                for t in 0..mask[b].len() {
                    if mask[b][t] == 0.0 {
                        continue;
                    }
                    let r = ((base[b][t] - old[b][t]) as f64).exp();
                    let a = adv[b][t] as f64;
                    let near_kink = match clip {
                        PolicyClip::Cispo { .. }
                        | PolicyClip::Gspo { .. }
                        | PolicyClip::Unclipped => false,
                        PolicyClip::Advantage { alpha } => {
                            ((r * a).abs() - alpha).abs() < 0.05 * alpha
                        }
                        PolicyClip::Ratio {
                            eps_low,
                            eps_high,
                            dual_clip_c,
                        } => {
                            (r - 1.0 - eps_high).abs() < 0.01
                                || (r - 1.0 + eps_low).abs() < 0.01
                                || (a < 0.0 && (r - dual_clip_c).abs() < 0.01)
                        }
                    };
                    if near_kink {
                        continue;
                    }
                    let eval = |delta: f32| {
                        let mut x = base.clone();
                        x[b][t] += delta;
                        let x = Tensor::from_vec(x.concat(), bt.log_prob.shape(), &Device::Cpu)
                            .expect("t");
                        minibatch_policy_loss(&bt, &x, &clip, mode)
                            .0
                            .to_scalar::<f32>()
                            .expect("s") as f64
                    };
                    let fd = (eval(h) - eval(-h)) / (2.0 * h as f64);
                    let ad = g[b][t] as f64;
                    assert!(
                        (fd - ad).abs() < 2e-3 + 1e-2 * ad.abs(),
                        "{clip:?} {name} [{b}][{t}]: autograd {ad}, finite difference {fd}"
                    );
                }
            }
        }
    }
}

#[test]
fn acpo_with_infinite_alpha_is_the_unclipped_cpi_objective() {
    let f = fixture();
    let bt = batch(&f);
    let agg = loss::Aggregation::whole(LossAggMode::TokenMean, &bt.mask, bt.horizon).expect("agg");
    let clip = PolicyClip::Advantage {
        alpha: f64::INFINITY,
    };
    let out =
        loss::policy_loss(&clip, &bt.log_prob, &bt.old, &bt.adv, &bt.mask, &agg).expect("loss");
    // CPI: −mean over valid tokens of r·Â.
    let (m, lp, old, adv) = (
        host(&bt.mask),
        host(&bt.log_prob),
        host(&bt.old),
        host(&bt.adv),
    );
    let (mut sum, mut n) = (0f64, 0f64);
    for b in 0..m.len() {
        for t in 0..m[b].len() {
            if m[b][t] != 0.0 {
                sum += ((lp[b][t] - old[b][t]) as f64).exp() * adv[b][t] as f64;
                n += 1.0;
            }
        }
    }
    let got = out.loss.to_scalar::<f32>().expect("scalar") as f64;
    assert!(
        close(got, -sum / n, 1e-5),
        "ACPO(α=∞) {got} vs CPI {}",
        -sum / n
    );
    assert_eq!(
        out.stats.acpo_clipfrac_upper + out.stats.acpo_clipfrac_lower,
        0.0
    );
    // The unclipped control (issue #23) is the same objective, token by token.
    let control = loss::policy_loss(
        &PolicyClip::Unclipped,
        &bt.log_prob,
        &bt.old,
        &bt.adv,
        &bt.mask,
        &agg,
    )
    .expect("loss");
    assert_eq!(host(&control.per_token), host(&out.per_token));
}

#[test]
fn padding_never_changes_any_output() {
    let f = fixture();
    let bt = batch(&f);
    // Replace every padding value with NaN and widen the batch by two padding columns.
    let poison = |t: &Tensor| {
        let m = host(&bt.mask);
        let x: Vec<Vec<f32>> = host(t)
            .iter()
            .zip(&m)
            .map(|(r, mr)| {
                let mut r: Vec<f32> = r
                    .iter()
                    .zip(mr)
                    .map(|(v, k)| if *k == 0.0 { f32::NAN } else { *v })
                    .collect();
                r.extend([f32::NAN, f32::NAN]);
                r
            })
            .collect();
        let (b, w) = (x.len(), x[0].len());
        Tensor::from_vec(x.concat(), (b, w), &Device::Cpu).expect("tensor")
    };
    let wide_mask = {
        let m: Vec<Vec<f32>> = host(&bt.mask)
            .into_iter()
            .map(|mut r| {
                r.extend([0.0, 0.0]);
                r
            })
            .collect();
        let (b, w) = (m.len(), m[0].len());
        Tensor::from_vec(m.concat(), (b, w), &Device::Cpu).expect("tensor")
    };
    for case in f["policy"].as_array().expect("cases") {
        let clip = clip_of(&case["clip"]);
        for (_, mode) in MODES {
            let a1 = loss::Aggregation::whole(mode, &bt.mask, bt.horizon).expect("agg");
            let a2 = loss::Aggregation::whole(mode, &wide_mask, bt.horizon).expect("agg");
            let clean = loss::policy_loss(&clip, &bt.log_prob, &bt.old, &bt.adv, &bt.mask, &a1)
                .expect("loss");
            let dirty = loss::policy_loss(
                &clip,
                &poison(&bt.log_prob),
                &poison(&bt.old),
                &poison(&bt.adv),
                &wide_mask,
                &a2,
            )
            .expect("loss");
            // Widening reorders float sums, so equality is to rounding here; NaN would show.
            let (c, d) = (
                clean.loss.to_scalar::<f32>().expect("s") as f64,
                dirty.loss.to_scalar::<f32>().expect("s") as f64,
            );
            assert!(close(c, d, 1e-6), "{clip:?} {mode:?}: {c} vs {d}");
            assert_eq!(clean.stats.tokens, dirty.stats.tokens);
            assert!(
                close(clean.stats.ppo_kl, dirty.stats.ppo_kl, 1e-6)
                    && close(clean.stats.ratio_adv_mean, dirty.stats.ratio_adv_mean, 1e-6)
            );
            assert_eq!(
                (
                    clean.stats.pg_clipfrac,
                    clean.stats.acpo_clipfrac_lower,
                    clean.stats.ratio_adv_abs_max
                ),
                (
                    dirty.stats.pg_clipfrac,
                    dirty.stats.acpo_clipfrac_lower,
                    dirty.stats.ratio_adv_abs_max
                )
            );
        }
    }
    let i = &f["inputs"];
    let gae_clean = advantage::gae(
        &tensor(&i["token_rewards"]),
        &tensor(&i["values"]),
        &bt.mask,
        0.99,
        0.95,
        true,
    )
    .expect("gae");
    let gae_dirty = advantage::gae(
        &poison(&tensor(&i["token_rewards"])),
        &poison(&tensor(&i["values"])),
        &wide_mask,
        0.99,
        0.95,
        true,
    )
    .expect("gae");
    let narrow = |t: &Tensor| host(&t.narrow(1, 0, bt.mask.dim(1).expect("T")).expect("narrow"));
    assert_eq!(host(&gae_clean.advantages), narrow(&gae_dirty.advantages));
    assert_eq!(host(&gae_clean.returns), narrow(&gae_dirty.returns));
    let agg = loss::Aggregation::whole(LossAggMode::TokenMean, &bt.mask, bt.horizon).expect("agg");
    let agg_w =
        loss::Aggregation::whole(LossAggMode::TokenMean, &wide_mask, bt.horizon).expect("agg");
    let v1 = loss::value_loss(
        &tensor(&i["values"]),
        &tensor(&i["old_values"]),
        &tensor(&i["returns"]),
        &bt.mask,
        0.5,
        &agg,
    )
    .expect("value loss");
    let v2 = loss::value_loss(
        &poison(&tensor(&i["values"])),
        &poison(&tensor(&i["old_values"])),
        &poison(&tensor(&i["returns"])),
        &wide_mask,
        0.5,
        &agg_w,
    )
    .expect("value loss");
    assert!(close(
        v1.loss.to_scalar::<f32>().expect("s") as f64,
        v2.loss.to_scalar::<f32>().expect("s") as f64,
        1e-6
    ));
    assert_eq!(v1.clipfrac, v2.clipfrac);
}

#[test]
fn token_mean_is_exact_across_micro_batches_and_the_verl_legacy_mode_is_not() {
    let f = fixture();
    let bt = batch(&f);
    let clip = PolicyClip::Advantage { alpha: 2.0 };
    let whole = |mode| {
        let agg = loss::Aggregation::whole(mode, &bt.mask, bt.horizon).expect("agg");
        loss::policy_loss(&clip, &bt.log_prob, &bt.old, &bt.adv, &bt.mask, &agg)
            .expect("loss")
            .loss
            .to_scalar::<f32>()
            .expect("s")
    };
    let split = |mode| {
        minibatch_policy_loss(&bt, &bt.log_prob, &clip, mode)
            .0
            .to_scalar::<f32>()
            .expect("s")
    };
    for mode in [
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean,
        LossAggMode::SeqMeanTokenSumNorm,
    ] {
        assert!(
            close(split(mode) as f64, whole(mode) as f64, 1e-6),
            "{mode:?} depends on the micro-batch split"
        );
    }
    // The micro-batches hold 21 and 13 tokens, so the mean of their means is not the token mean.
    let legacy = split(LossAggMode::TokenMeanMicrobatch) as f64;
    assert!((legacy - whole(LossAggMode::TokenMean) as f64).abs() > 1e-3);
}

#[test]
fn gae_matches_the_reference_and_whitened_advantages_are_standardised() {
    let f = fixture();
    let i = &f["inputs"];
    let mask = tensor(&i["mask"]);
    for case in f["gae"].as_array().expect("gae cases") {
        let (gamma, lam, whiten) = (
            case["gamma"].as_f64().expect("gamma"),
            case["lam"].as_f64().expect("lam"),
            case["whiten"].as_bool().expect("whiten"),
        );
        let out = advantage::gae(
            &tensor(&i["token_rewards"]),
            &tensor(&i["values"]),
            &mask,
            gamma,
            lam,
            whiten,
        )
        .expect("gae");
        assert_rows_close(
            &host(&out.advantages),
            &rows(&case["advantages"]),
            1e-5,
            "advantages",
        );
        assert_rows_close(
            &host(&out.returns),
            &rows(&case["returns"]),
            1e-5,
            "returns",
        );
        if whiten {
            let a: Vec<f64> = host(&out.advantages)
                .concat()
                .iter()
                .zip(host(&mask).concat())
                .filter(|(_, m)| *m != 0.0)
                .map(|(v, _)| *v as f64)
                .collect();
            let n = a.len() as f64;
            let mean = a.iter().sum::<f64>() / n;
            let var = a.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
            assert!(
                mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5,
                "mean {mean}, var {var}"
            );
        }
    }
}

#[test]
fn grpo_advantages_match_the_reference_and_are_zero_mean_per_group() {
    let f = fixture();
    let i = &f["inputs"];
    let mask = tensor(&i["mask"]);
    let scores: Vec<f32> = i["scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|v| v.as_f64().expect("s") as f32)
        .collect();
    let groups: Vec<usize> = i["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|v| v.as_u64().expect("g") as usize)
        .collect();
    for case in f["grpo"].as_array().expect("grpo cases") {
        let norm = case["norm_by_std"].as_bool().expect("norm");
        let out = advantage::grpo(&scores, &groups, &mask, norm).expect("grpo");
        assert_rows_close(
            &host(&out),
            &rows(&case["advantages"]),
            1e-5,
            "grpo advantages",
        );
        let per = advantage::group_normalize(&scores, &groups, norm);
        for g in 0..3 {
            let sum: f32 = per
                .iter()
                .zip(&groups)
                .filter(|(_, gg)| **gg == g)
                .map(|(a, _)| *a)
                .sum();
            assert!(sum.abs() < 1e-5, "group {g} advantages sum to {sum}");
        }
        assert_eq!(
            per[5], 0.0,
            "a group of one response has no baseline: advantage 0"
        );
    }
}

#[test]
fn value_loss_matches_the_reference_with_exact_gradients() {
    let f = fixture();
    let i = &f["inputs"];
    let mask = tensor(&i["mask"]);
    for case in f["value"].as_array().expect("value cases") {
        let mode = MODES
            .iter()
            .find(|(n, _)| *n == case["mode"].as_str().expect("mode"))
            .expect("known mode")
            .1;
        let agg = loss::Aggregation::whole(mode, &mask, 12).expect("agg");
        let v = Var::from_tensor(&tensor(&i["values"])).expect("var");
        let out = loss::value_loss(
            v.as_tensor(),
            &tensor(&i["old_values"]),
            &tensor(&i["returns"]),
            &mask,
            0.5,
            &agg,
        )
        .expect("value loss");
        let got = out.loss.to_scalar::<f32>().expect("s") as f64;
        let want = case["loss"].as_f64().expect("loss");
        assert!(
            close(got, want, 1e-5),
            "{mode:?}: value loss {got}, reference {want}"
        );
        assert!(close(
            out.clipfrac,
            case["clipfrac"].as_f64().expect("clipfrac"),
            1e-9
        ));
        if mode == LossAggMode::TokenMean {
            // token-mean: ∂(0.5·Σ e / N)/∂V = 0.5 · (per-token derivative) / N.
            let n = host(&mask).concat().iter().sum::<f32>();
            let g = host(
                out.loss
                    .backward()
                    .expect("backward")
                    .get(v.as_tensor())
                    .expect("grad"),
            );
            let want: Vec<Vec<f32>> = rows(&case["per_token_grad"])
                .iter()
                .map(|r| r.iter().map(|x| 0.5 * x / n).collect())
                .collect();
            assert_rows_close(&g, &want, 1e-5, "dL/dV");
        }
    }
}

#[test]
fn log_probs_and_entropy_match_the_reference() {
    let f = fixture();
    let i = &f["inputs"];
    let logits = tensor(&i["logits"]);
    let tokens: Vec<u32> = i["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|v| v.as_u64().expect("t") as u32)
        .collect();
    let tokens = Tensor::new(tokens.as_slice(), &Device::Cpu).expect("tokens");
    for case in f["token"].as_array().expect("token cases") {
        let temp = case["temperature"].as_f64().expect("T");
        let lp = token::log_probs(&logits, &tokens, temp)
            .expect("log probs")
            .to_vec1::<f32>()
            .expect("vec");
        let ent = token::entropy(&logits, temp)
            .expect("entropy")
            .to_vec1::<f32>()
            .expect("vec");
        assert_rows_close(
            &[lp],
            &rows(&Value::Array(vec![case["log_probs"].clone()])),
            1e-5,
            "log_probs",
        );
        assert_rows_close(
            &[ent],
            &rows(&Value::Array(vec![case["entropy"].clone()])),
            1e-5,
            "entropy",
        );
    }
}

#[test]
fn entropy_gradient_agrees_with_finite_differences() {
    // In f64 so the finite difference is accurate to ~1e-8.
    let f = fixture();
    let logits = tensor(&f["inputs"]["logits"])
        .to_dtype(candle_core::DType::F64)
        .expect("f64");
    let v = Var::from_tensor(&logits).expect("var");
    let g = token::entropy(v.as_tensor(), 0.7)
        .expect("entropy")
        .sum_all()
        .expect("sum")
        .backward()
        .expect("bw");
    let g = g
        .get(v.as_tensor())
        .expect("grad")
        .to_vec2::<f64>()
        .expect("f64");
    let base = logits.to_vec2::<f64>().expect("f64");
    let h = 1e-5f64;
    for b in 0..base.len() {
        for k in 0..base[b].len() {
            let eval = |d: f64| {
                let mut x = base.clone();
                x[b][k] += d;
                let x = Tensor::from_vec(x.concat(), logits.shape(), &Device::Cpu).expect("t");
                token::entropy(&x, 0.7)
                    .expect("e")
                    .sum_all()
                    .expect("s")
                    .to_scalar::<f64>()
                    .expect("s")
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h);
            assert!(
                (fd - g[b][k]).abs() < 1e-6,
                "entropy grad [{b}][{k}]: {} vs {fd}",
                g[b][k]
            );
        }
    }
}

#[test]
fn coefficient_diagnostics_match_the_reference() {
    let f = fixture();
    let bt = batch(&f);
    let d = &f["diagnostics"];
    let got = acpo::algo::prop1::coefficient_diagnostics(
        &bt.log_prob,
        &bt.old,
        &bt.adv,
        &bt.mask,
        2.0,
        0.2,
        0.28,
    )
    .expect("diagnostics");
    let want_values: Vec<f32> = d["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| v.as_f64().expect("v") as f32)
        .collect();
    assert_rows_close(
        std::slice::from_ref(&got.values),
        &[want_values],
        1e-5,
        "r·A values",
    );
    for (name, value) in [
        ("mean", got.mean),
        ("abs_max", got.abs_max),
        ("retain_acpo", got.retain_acpo),
        ("retain_ppo", got.retain_ppo),
        ("second_moment_acpo", got.second_moment_acpo),
        ("second_moment_ppo", got.second_moment_ppo),
    ] {
        let w = d[name].as_f64().expect("number");
        assert!(close(value, w, 1e-5), "{name}: {value}, reference {w}");
    }
}

/// Issue #17 item 11: the f32 entropy stays accurate when the logits are large. A trained
/// policy's logits are large and peaked (low entropy): there the old form `lse − Σ p·z` took
/// the difference of two numbers as large as the logits. The reference is `−Σ p log p` in f64
/// of the very same (f32) logits, computed here independently.
#[test]
fn entropy_is_accurate_in_f32_at_large_logit_scales() {
    let v = 1000;
    let mut rng = acpo::rng::SplitMix64::new(11);
    let base: Vec<f64> = (0..v).map(|_| rng.next_normal()).collect();
    for (scale, peak) in [(1.0, 4.0), (100.0, 8.0), (300.0, 10.0), (600.0, 12.0)] {
        let zf: Vec<f32> = base
            .iter()
            .enumerate()
            .map(|(i, x)| (scale + x + if i == 7 { peak } else { 0.0 }) as f32)
            .collect();
        let z: Vec<f64> = zf.iter().map(|&x| x as f64).collect();
        let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = z.iter().map(|x| (x - max).exp()).sum();
        let want: f64 = -z
            .iter()
            .map(|x| {
                let p = (x - max).exp() / total;
                if p > 0.0 {
                    p * p.ln()
                } else {
                    0.0
                }
            })
            .sum::<f64>();
        let t = Tensor::from_vec(zf, (1, v), &Device::Cpu).expect("tensor");
        let got = token::entropy(&t, 1.0)
            .expect("entropy")
            .to_vec1::<f32>()
            .expect("vec")[0] as f64;
        // f32 arithmetic on O(1) numbers: a few units of its epsilon, relative
        let tol = 1e-6 + 1e-5 * want;
        assert!(
            (got - want).abs() <= tol,
            "scale {scale}: entropy {got} vs f64 {want} (error {:.1e}, tolerance {tol:.1e})",
            (got - want).abs()
        );
    }
}

/// The regime diagnostic (#22): where the ratio clip and ACPO's clip disagree, against a
/// token-by-token scalar reference of the two textbook rules.
#[test]
fn the_two_clip_rules_disagreement_matches_a_scalar_reference() {
    let (b, t) = (4usize, 9usize);
    let mut rng = acpo::rng::SplitMix64::new(77);
    let mut draw = |scale: f64| -> Vec<f32> {
        (0..b * t)
            .map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32)
            .collect()
    };
    let old: Vec<f32> = draw(1.0).iter().map(|x| -x.abs() - 0.1).collect();
    let lp: Vec<f32> = old.iter().zip(draw(0.8)).map(|(o, d)| o + d).collect();
    let adv = draw(3.0);
    let mask: Vec<f32> = (0..b * t)
        .map(|i| f32::from(u8::from(i % t < 9 - i / t)))
        .collect();
    let tensor = |v: &[f32]| Tensor::from_vec(v.to_vec(), (b, t), &Device::Cpu).expect("t");
    let ratio_rule = PolicyClip::Ratio {
        eps_low: 0.2,
        eps_high: 0.28,
        dual_clip_c: 3.0,
    };
    let acpo_rule = PolicyClip::Advantage { alpha: 2.0 };
    let got = clip::rule_disagreement(
        &ratio_rule,
        &acpo_rule,
        &tensor(&lp),
        &tensor(&old),
        &tensor(&adv),
        &tensor(&mask),
    )
    .expect("disagreement");
    let swapped = clip::rule_disagreement(
        &acpo_rule,
        &ratio_rule,
        &tensor(&lp),
        &tensor(&old),
        &tensor(&adv),
        &tensor(&mask),
    )
    .expect("disagreement");
    assert_eq!(
        got,
        (swapped.1, swapped.0),
        "each rule's zeroes, in the order asked"
    );
    // the trainer's pair, weighted by the batch's valid tokens
    let compared = clip::compared_rules(acpo::algo::method::AlgorithmKind::GrpoAc, &acpo_rule);
    assert_eq!((compared.ratio, compared.acpo), (ratio_rule, acpo_rule));
    let d = compared
        .disagreement(&tensor(&lp), &tensor(&old), &tensor(&adv), &tensor(&mask))
        .expect("disagreement");
    assert_eq!((d.ratio_zeroes, d.acpo_zeroes), got);
    assert_eq!(d.tokens, mask.iter().map(|&m| f64::from(m)).sum::<f64>());
    // the reference, in f64 token by token
    let (mut ratio_zeroes, mut acpo_zeroes, mut n) = (0.0, 0.0, 0.0);
    for i in 0..b * t {
        if mask[i] == 0.0 {
            continue;
        }
        n += 1.0;
        let a = f64::from(adv[i]);
        let r = (f64::from(lp[i]) - f64::from(old[i]))
            .clamp(-20.0, 20.0)
            .exp();
        let (loss1, loss2) = (-a * r, -a * r.clamp(0.8, 1.28));
        let ratio_clipped = loss2 > loss1;
        let dual = a < 0.0 && loss1.max(loss2) > -a * 3.0;
        let keep_ratio = !ratio_clipped && !dual;
        let keep_acpo = (r * a).abs() <= 2.0;
        ratio_zeroes += f64::from(u8::from(!keep_ratio && keep_acpo));
        acpo_zeroes += f64::from(u8::from(keep_ratio && !keep_acpo));
    }
    let want = (ratio_zeroes / n, acpo_zeroes / n);
    assert!(
        want.0 > 0.0 && want.1 > 0.0,
        "the inputs exercise both disagreements: {want:?}"
    );
    assert!(
        (got.0 - want.0).abs() < 1e-9 && (got.1 - want.1).abs() < 1e-9,
        "{got:?} vs {want:?}"
    );
    // a rule never disagrees with itself
    assert_eq!(
        clip::rule_disagreement(
            &acpo_rule,
            &acpo_rule,
            &tensor(&lp),
            &tensor(&old),
            &tensor(&adv),
            &tensor(&mask)
        )
        .expect("disagreement"),
        (0.0, 0.0)
    );
}

/// GSPO's cap (verl's `compute_policy_loss_gspo`): a sequence whose mean log-ratio exceeds 10
/// is valued at s = e^10 and gets no gradient, while the other sequences train as usual. The
/// fixture's inputs never reach the cap, so this checks it by hand.
#[test]
fn gspo_caps_the_sequence_log_ratio_at_ten_with_no_gradient_there() {
    let dev = Device::Cpu;
    // row 0: log π − log π_old = 11 on each token, Â = −1 (the unclipped term −Â·s is the
    // larger, so only the cap stops its gradient); row 1: 0.1, Â = +1, inside the clip range
    let lp =
        Var::from_tensor(&Tensor::new(&[[11f32, 11.0, 11.0], [0.1, 0.1, 0.1]], &dev).expect("lp"))
            .expect("var");
    let old = Tensor::zeros((2, 3), candle_core::DType::F32, &dev).expect("old");
    let adv = Tensor::new(&[[-1f32, -1.0, -1.0], [1.0, 1.0, 1.0]], &dev).expect("adv");
    let mask = Tensor::ones((2, 3), candle_core::DType::F32, &dev).expect("mask");
    let clip::RuleTerms {
        objective: per_token,
        keep,
        stats,
    } = clip::gspo_loss(lp.as_tensor(), &old, &adv, &mask, 0.2, 0.28).expect("gspo");
    assert_eq!(host(&keep), [[0.0; 3], [1.0; 3]], "the gradient mask");
    let values = host(&per_token);
    let (capped, inside) = (10f64.exp(), 0.1f64.exp());
    for t in 0..3 {
        assert!(close(values[0][t] as f64, capped, 1e-6), "{values:?}");
        assert!(close(values[1][t] as f64, -inside, 1e-6), "{values:?}");
    }
    assert_eq!(stats.pg_clipfrac, 0.0, "neither row is clipped");
    let grads = per_token
        .sum_all()
        .expect("sum")
        .backward()
        .expect("backward");
    let g = host(grads.get(lp.as_tensor()).expect("gradient"));
    assert_eq!(g[0], [0.0; 3], "no gradient beyond the cap");
    for x in &g[1] {
        // d(−Â·s)/d log π_t = −Â·s at each token
        assert!(close(*x as f64, -inside, 1e-6), "{g:?}");
    }
}
