//! The RL trainer at smoke scale: a tiny random Qwen3 with a character tokenizer on the
//! synthetic task, through the same code path as every scale.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use acpo::data::DataLocation;
use acpo::hub::HubOptions;
use acpo::manifest::Experiment;
use acpo::train::{TrainError, TrainOptions, Trainer};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A temp dir with `models/smoke-qwen3-tiny` (as the smoke manifests expect), created by the
/// manifests' own `model.init` (random weights, char tokenizer, a few warm-start steps).
pub(crate) fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    let (exp, _) = manifest(dir.path(), "smoke-grpo", &[]);
    acpo::train::ensure_model(&exp, |_| {}).expect("model");
    dir
}

/// The smoke manifest `name`, edited by `(from, to)` replacements, with the model dir made absolute.
pub(crate) fn manifest(ws: &Path, name: &str, edits: &[(&str, &str)]) -> (Experiment, String) {
    let mut text = std::fs::read_to_string(repo().join(format!("experiments/smoke/{name}.yaml")))
        .expect("manifest");
    text = text.replace(
        "dir: models/smoke-qwen3-tiny",
        &format!("dir: {}", ws.join("models/smoke-qwen3-tiny").display()),
    );
    for (from, to) in edits {
        assert!(text.contains(from), "{name}: no `{from}` to edit");
        text = text.replace(from, to);
    }
    let exp =
        Experiment::from_yaml(&text, Path::new(&format!("{name}.yaml"))).expect("valid manifest");
    (exp, text)
}

pub(crate) fn options(out: &Path, resume: bool, max_steps: Option<usize>) -> TrainOptions {
    TrainOptions {
        out_root: out.to_owned(),
        resume,
        max_steps,
        // The smoke runs train on the synthetic task: no data directory is read.
        data: DataLocation::Dir(out.join("no-data-needed")),
        hub: HubOptions {
            cache_dir: out.join("hub"),
            offline: true,
        },
        start_evals: None,
    }
}

pub(crate) fn train(
    exp: &Experiment,
    text: &str,
    opts: &TrainOptions,
) -> Result<PathBuf, TrainError> {
    let mut t = Trainer::new(exp, text, opts)?;
    Ok(t.run(opts, &mut |_| {})?.dir)
}

pub(crate) fn metrics(dir: &Path) -> Vec<BTreeMap<String, f64>> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

#[test]
fn all_four_algorithms_train_evaluate_and_checkpoint() {
    let ws = workspace();
    for (name, key) in [
        ("smoke-ppo", "actor/pg_clipfrac"),
        ("smoke-ppo-ac", "actor/acpo_clipfrac"),
        ("smoke-grpo", "actor/pg_clipfrac"),
        ("smoke-grpo-ac", "actor/acpo_clipfrac"),
    ] {
        let (exp, text) = manifest(ws.path(), name, &[]);
        let dir = train(
            &exp,
            &text,
            &options(&ws.path().join("results"), false, None),
        )
        .expect("trains");
        let m = metrics(&dir);
        assert_eq!(m.len(), 3, "{name}: one metrics line per step");
        for line in &m {
            for k in [
                key,
                "actor/entropy",
                "actor/grad_norm",
                "actor/ppo_kl",
                "reward/acc/mean",
                "response_length/mean",
            ] {
                assert!(
                    line.get(k).is_some_and(|v| v.is_finite()),
                    "{name}: metric {k} missing"
                );
            }
            assert_eq!(
                line.contains_key("critic/vf_loss"),
                name.starts_with("smoke-ppo"),
                "{name}: critic metrics"
            );
        }
        let evals = std::fs::read_to_string(dir.join("eval.jsonl")).expect("eval");
        let steps: Vec<u64> = evals
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("j")["step"]
                    .as_u64()
                    .expect("s")
            })
            .collect();
        assert_eq!(
            steps,
            vec![0, 2, 3],
            "{name}: eval at step 0, every 2 steps and at the end"
        );
        assert_eq!(
            acpo::run::RunDir::at(&dir)
                .latest_checkpoint()
                .expect("ls")
                .map(|c| c.0),
            Some(3)
        );
        assert!(dir
            .join("checkpoints/step_000003/policy/model.safetensors")
            .exists());
        assert_eq!(
            dir.join("checkpoints/step_000003/critic").exists(),
            name.starts_with("smoke-ppo")
        );
    }
}

pub(crate) fn without_timing(m: Vec<BTreeMap<String, f64>>) -> Vec<BTreeMap<String, f64>> {
    m.into_iter()
        .map(|l| {
            l.into_iter()
                .filter(|(k, _)| !k.starts_with("timing") && !k.starts_with("perf"))
                .collect()
        })
        .collect()
}

#[test]
fn resume_is_bit_identical_to_an_uninterrupted_run() {
    let edits = [
        ("total_steps: 3", "total_steps: 6"),
        ("eval_every: 2", "eval_every: 3"),
        ("checkpoint_every: 2", "checkpoint_every: 3"),
    ];
    for name in ["smoke-ppo-ac", "smoke-grpo"] {
        let ws = workspace();
        let (exp, text) = manifest(ws.path(), name, &edits);
        let straight =
            train(&exp, &text, &options(&ws.path().join("a"), false, None)).expect("6 steps");
        let first =
            train(&exp, &text, &options(&ws.path().join("b"), false, Some(3))).expect("3 steps");
        assert_eq!(
            acpo::run::RunDir::at(&first)
                .latest_checkpoint()
                .expect("ls")
                .map(|c| c.0),
            Some(3)
        );
        let err =
            train(&exp, &text, &options(&ws.path().join("b"), false, None)).expect_err("exists");
        assert!(err.to_string().contains("--resume"), "{err}");
        let resumed =
            train(&exp, &text, &options(&ws.path().join("b"), true, None)).expect("resume 3 more");
        let bytes =
            |d: &Path, f: &str| std::fs::read(d.join("checkpoints/step_000006").join(f)).expect(f);
        for f in [
            "policy/model.safetensors",
            "actor_optim.safetensors",
            "state.json",
        ] {
            assert_eq!(
                bytes(&straight, f),
                bytes(&resumed, f),
                "{name}: {f} differs after resume"
            );
        }
        if name == "smoke-ppo-ac" {
            for f in ["critic/model.safetensors", "critic_optim.safetensors"] {
                assert_eq!(
                    bytes(&straight, f),
                    bytes(&resumed, f),
                    "{name}: {f} differs after resume"
                );
            }
        }
        assert_eq!(
            without_timing(metrics(&straight)),
            without_timing(metrics(&resumed)),
            "{name}: metrics differ"
        );
        let evals = |d: &Path| std::fs::read_to_string(d.join("eval.jsonl")).expect("eval");
        assert_eq!(evals(&straight), evals(&resumed));
        let tails = |d: &Path| std::fs::read(d.join("tails/step_000006.json")).expect("tails");
        assert_eq!(
            tails(&straight),
            tails(&resumed),
            "{name}: tails differ after resume"
        );
    }
}

#[test]
fn acpo_clips_with_a_small_alpha_and_never_with_a_huge_one() {
    let ws = workspace();
    let small = manifest(ws.path(), "smoke-ppo-ac", &[("alpha: 3.0", "alpha: 0.001")]);
    let huge = manifest(ws.path(), "smoke-ppo-ac", &[("alpha: 3.0", "alpha: 1.0e9")]);
    let frac = |(exp, text): &(Experiment, String)| -> f64 {
        let dir = train(exp, text, &options(&ws.path().join("r"), false, Some(2))).expect("train");
        metrics(&dir).iter().map(|m| m["actor/acpo_clipfrac"]).sum()
    };
    assert!(
        frac(&small) > 0.5,
        "with α = 0.001 almost every whitened-GAE token is clipped"
    );
    assert_eq!(frac(&huge), 0.0);
}

#[test]
fn ppo_clips_the_ratio_once_mini_batches_are_off_policy() {
    // Two epochs at a high learning rate: the second pass sees a moved policy (r ≠ 1).
    let ws = workspace();
    let edits = [("epochs: 1", "epochs: 2"), ("    lr: 1.0e-3\n    lr_schedule: constant\n    grad_clip: 1.0\n    weight_decay: 0.01\n    betas: [0.9, 0.999]\n    eps: 1.0e-8\n  mini_batch_size", "    lr: 5.0e-2\n    lr_schedule: constant\n    grad_clip: 1.0\n    weight_decay: 0.01\n    betas: [0.9, 0.999]\n    eps: 1.0e-8\n  mini_batch_size"), ("clip_ratio_low: 0.2", "clip_ratio_low: 0.01"), ("clip_ratio_high: 0.2", "clip_ratio_high: 0.01")];
    let (exp, text) = manifest(ws.path(), "smoke-ppo", &edits);
    let dir = train(&exp, &text, &options(&ws.path().join("r"), false, Some(2))).expect("train");
    let m = metrics(&dir);
    assert!(m.iter().any(|l| l["actor/pg_clipfrac"] > 0.0), "{m:?}");
    assert!(m.iter().any(|l| l["actor/ppo_kl"].abs() > 0.0));
    // Issue #22: the first mini-batch of a step is on-policy (r = 1 up to rounding: the same
    // weights scored the tokens), the later ones are not; both quantile sets are logged.
    for l in &m {
        for q in ["p01", "p99"] {
            let first = l[&format!("actor/ratio_{q}_first")];
            assert!(
                (first - 1.0).abs() < 1e-4,
                "first mini-batch r {q} = {first}"
            );
        }
        assert!(l["actor/ratio_adv_abs_p99_first"] >= 0.0);
        assert!(l["actor/ratio_adv_abs_p99_later"] >= 0.0);
    }
    let spread =
        |l: &BTreeMap<String, f64>| l["actor/ratio_p99_later"] - l["actor/ratio_p01_later"];
    assert!(
        m.iter().any(|l| spread(l) > 1e-3),
        "later mini-batches are off-policy: {m:?}"
    );
    // The clip acts only where the policy moved: the first mini-batch (r = 1) never clips, so
    // the later mini-batches' share is the step's share scaled by all tokens / later tokens,
    // at least the step's (and both rules' disagreement is logged for them too).
    for l in &m {
        let (all, later) = (l["actor/pg_clipfrac"], l["actor/pg_clipfrac_later"]);
        assert!(later >= all - 1e-12, "later {later} < all {all}");
        assert!(l["actor/clip_disagree_ratio_zeroes_later"] >= 0.0);
        assert!(l["actor/clip_disagree_acpo_zeroes_later"] >= 0.0);
    }
    assert!(m.iter().any(|l| l["actor/pg_clipfrac_later"] > 0.0));
}

/// Nearest-rank quantiles of r and |r·Â| (issue #22's regime diagnostics).
#[test]
fn ratio_quantiles_take_the_nearest_rank() {
    use acpo::train::outcomes::RatioQuantiles;
    // r = 0.01, 0.02, …, 1.00 (shuffled), |r·Â| = 100 r
    let values: Vec<(f32, f32)> = (1..=100)
        .map(|i| ((i * 37) % 100 + 1) as f32 / 100.0)
        .map(|r| (r, 100.0 * r))
        .collect();
    let q = RatioQuantiles::of(&values).expect("quantiles");
    assert_eq!(q.ratio_p01, 0.01f32 as f64);
    assert_eq!(q.ratio_p99, 0.99f32 as f64);
    assert_eq!(q.ratio_adv_abs_p99, 99.0);
    assert_eq!(RatioQuantiles::of(&[]), None);
}

#[test]
fn half_written_checkpoints_are_never_loaded() {
    let ws = workspace();
    let edits = [
        ("total_steps: 3", "total_steps: 5"),
        ("checkpoint_every: 2", "checkpoint_every: 1"),
    ];
    let (exp, text) = manifest(ws.path(), "smoke-grpo-ac", &edits);
    let dir = train(&exp, &text, &options(&ws.path().join("r"), false, Some(2))).expect("2 steps");
    // A crash mid-checkpoint leaves a .tmp directory; a directory without state.json is incomplete.
    std::fs::create_dir_all(dir.join("checkpoints/step_000003.tmp/policy")).expect("mkdir");
    std::fs::write(
        dir.join("checkpoints/step_000003.tmp/policy/model.safetensors"),
        b"garbage",
    )
    .expect("w");
    std::fs::create_dir_all(dir.join("checkpoints/step_000004")).expect("mkdir");
    assert_eq!(
        acpo::run::RunDir::at(&dir)
            .latest_checkpoint()
            .expect("ls")
            .map(|c| c.0),
        Some(2)
    );
    let dir = train(&exp, &text, &options(&ws.path().join("r"), true, None))
        .expect("resumes from step 2");
    assert_eq!(metrics(&dir).len(), 5);
    assert_eq!(
        acpo::run::RunDir::at(&dir)
            .latest_checkpoint()
            .expect("ls")
            .map(|c| c.0),
        Some(5)
    );
    assert!(
        !dir.join("checkpoints/step_000003.tmp").exists(),
        "the stale temp checkpoint was replaced"
    );
}

#[test]
fn a_nan_stops_the_run_naming_the_step_and_keeps_the_last_checkpoint() {
    let ws = workspace();
    let (exp, text) = manifest(
        ws.path(),
        "smoke-grpo",
        &[("total_steps: 3", "total_steps: 4")],
    );
    let out = ws.path().join("r");
    let dir = train(&exp, &text, &options(&out, false, Some(2))).expect("2 good steps");
    let ckpt =
        std::fs::read(dir.join("checkpoints/step_000002/policy/model.safetensors")).expect("ckpt");
    // Poison the model the run resumes from: NaN in one weight of the checkpoint's policy.
    let path = dir.join("checkpoints/step_000002/policy");
    let params =
        acpo::model::Params::load_dir(&path, candle_core::DType::F32, &candle_core::Device::Cpu)
            .expect("load");
    let (name, var) = params
        .vars()
        .find(|(n, _)| n.contains("mlp.up_proj"))
        .expect("a weight");
    let nan = candle_core::Tensor::full(f32::NAN, var.shape(), var.device()).expect("nan");
    var.set(&nan).expect("set");
    let _ = name;
    let cfg = acpo::model::QwenConfig::load(&path.join("config.json")).expect("cfg");
    acpo::model::init::save_model(&cfg, &params, &path).expect("save");
    let poisoned = std::fs::read(path.join("model.safetensors")).expect("read");
    let err = train(&exp, &text, &options(&out, true, None)).expect_err("NaN");
    let msg = err.to_string();
    assert!(
        msg.contains("step 3") && msg.contains("not applied"),
        "{msg}"
    );
    assert_eq!(
        metrics(&dir).len(),
        2,
        "no metrics line for the failed step"
    );
    assert_eq!(
        std::fs::read(path.join("model.safetensors")).expect("read"),
        poisoned,
        "the last checkpoint is untouched"
    );
    assert_ne!(ckpt, poisoned);
}

#[test]
fn difficulty_buckets_follow_the_papers_boundaries_and_histograms_count_exactly() {
    use acpo::run::tails::{Difficulty, Histogram};
    assert_eq!(Difficulty::of(1.0), Difficulty::Easy);
    assert_eq!(Difficulty::of(0.7), Difficulty::Easy);
    assert_eq!(Difficulty::of(0.69), Difficulty::Medium);
    assert_eq!(Difficulty::of(0.3), Difficulty::Medium);
    assert_eq!(Difficulty::of(0.29), Difficulty::Hard);
    assert_eq!(Difficulty::of(0.0), Difficulty::Hard);
    let mut h = Histogram::default();
    for x in [-25.0, -20.0, -0.05, 0.0, 0.05, 19.99, 20.0, f64::NAN] {
        h.add(x);
    }
    assert_eq!((h.count, h.underflow, h.overflow), (7, 1, 1));
    assert_eq!(h.counts[0], 1); // -20.0
    assert_eq!(h.counts[199], 1); // -0.05
    assert_eq!(h.counts[200], 2); // 0.0 and 0.05
    assert_eq!(h.counts[399], 1); // 19.99
    assert_eq!((h.min, h.max), (Some(-25.0), Some(20.0)));
}

#[test]
fn utc_timestamps_are_correct() {
    assert_eq!(acpo::run::provenance::utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(
        acpo::run::provenance::utc(951_782_400),
        "2000-02-29T00:00:00Z"
    );
    assert_eq!(
        acpo::run::provenance::utc(1_795_328_656),
        "2026-11-22T06:24:16Z"
    );
}

#[test]
fn settings_the_trainer_cannot_honour_are_refused_not_ignored() {
    let ws = workspace();
    let out = ws.path().join("r");
    // A KL term is refused by the manifest itself (tests/it/manifest.rs); the trainer refuses
    // it too if a validated experiment is changed in code.
    let (mut exp, text) = manifest(ws.path(), "smoke-grpo", &[]);
    exp.actor.kl_loss_coef = 0.1;
    let err =
        train(&exp, &text, &options(&out, false, None)).expect_err("KL needs a reference policy");
    assert!(err.to_string().contains("kl_loss_coef"), "{err}");
    if !cfg!(feature = "cuda") {
        let (exp, text) = manifest(ws.path(), "smoke-grpo", &[("device: cpu", "device: cuda")]);
        let err =
            train(&exp, &text, &options(&out, false, None)).expect_err("no CUDA in this build");
        assert!(err.to_string().contains("without CUDA"), "{err}");
    }
}

/// A run that died before its first checkpoint leaves metrics and eval lines but nothing to
/// resume from: `--resume` (as the error message advises) starts it afresh instead of
/// appending to the old lines (issue #17, item 3), and drops tails of steps it will redo.
#[test]
fn resume_without_a_checkpoint_starts_afresh_without_duplicated_lines() {
    let ws = workspace();
    let (exp, text) = manifest(ws.path(), "smoke-grpo", &[]);
    let straight = train(&exp, &text, &options(&ws.path().join("a"), false, None)).expect("run");
    let died = train(&exp, &text, &options(&ws.path().join("b"), false, None)).expect("run");
    std::fs::remove_dir_all(died.join("checkpoints")).expect("no checkpoint survived");
    let stale_tails = died.join("tails/step_000099.json");
    std::fs::create_dir_all(stale_tails.parent().expect("dir")).expect("mkdir");
    std::fs::write(&stale_tails, "{}").expect("w");

    let resumed = train(&exp, &text, &options(&ws.path().join("b"), true, None)).expect("resume");
    assert_eq!(resumed, died);
    let steps: Vec<f64> = metrics(&resumed)
        .iter()
        .map(|m| m["training/global_step"])
        .collect();
    assert_eq!(steps, vec![1.0, 2.0, 3.0], "one metrics line per step");
    assert_eq!(
        without_timing(metrics(&straight)),
        without_timing(metrics(&resumed))
    );
    let evals = |d: &Path| std::fs::read_to_string(d.join("eval.jsonl")).expect("eval");
    assert_eq!(
        evals(&straight),
        evals(&resumed),
        "one evaluation per eval step"
    );
    assert!(
        !stale_tails.exists(),
        "tails of steps after the start are dropped"
    );
}

/// Issue #17, item 6: a run killed between its final checkpoint and its SHA256SUMS leaves a
/// `SHA256SUMS.tmp` (and maybe a checkpoint's staging directory). `--resume` seals it, the new
/// sums list no temporary, and the run verifies again.
#[test]
fn a_run_killed_before_its_seal_is_sealed_by_resume_and_verifies() {
    let ws = workspace();
    let (exp, text) = manifest(ws.path(), "smoke-grpo", &[]);
    let dir = train(&exp, &text, &options(&ws.path().join("a"), false, None)).expect("run");
    let before = metrics(&dir);
    std::fs::remove_file(dir.join("SHA256SUMS")).expect("rm");
    std::fs::write(dir.join("SHA256SUMS.tmp"), "half written").expect("w");
    let staging = dir.join("checkpoints/step_000004.tmp");
    std::fs::create_dir_all(&staging).expect("mkdir");
    std::fs::write(staging.join("state.json"), "{").expect("w");
    let prov = std::fs::read_to_string(dir.join("provenance.json")).expect("prov");
    let mut prov: serde_json::Value = serde_json::from_str(&prov).expect("json");
    prov["finished_unix"] = serde_json::Value::Null;
    std::fs::write(dir.join("provenance.json"), prov.to_string()).expect("w");
    assert!(!acpo::run::RunDir::at(&dir).is_sealed());

    let resumed = train(&exp, &text, &options(&ws.path().join("a"), true, None)).expect("seal");
    assert!(acpo::run::RunDir::at(&resumed).is_sealed());
    let report = acpo::archive::verify(&resumed).expect("verify");
    assert!(report.ok(), "{}", report.describe());
    let sums = std::fs::read_to_string(resumed.join("SHA256SUMS")).expect("sums");
    assert!(!sums.contains(".tmp"), "{sums}");
    assert_eq!(without_timing(before), without_timing(metrics(&resumed)));
}

/// Issue #17, item 4: an update that leaves a parameter NaN (here: ε = 1e-50, 0 in f32, so an
/// embedding row without gradient gets 0/0 — a manifest can no longer ask for it, so the
/// validated value is overridden) stops the run before anything is checkpointed.
#[test]
fn an_update_that_makes_parameters_nan_stops_before_any_checkpoint() {
    let ws = workspace();
    let (mut exp, text) = manifest(ws.path(), "smoke-grpo", &[]);
    exp.actor.optim.eps = 1e-50;
    let err = train(&exp, &text, &options(&ws.path().join("a"), false, None)).expect_err("NaN");
    assert!(
        matches!(err, TrainError::NonFiniteParameters { step: 1 }),
        "{err}"
    );
    let run = acpo::run::RunDir::of(&exp, &ws.path().join("a"));
    assert_eq!(
        run.latest_checkpoint().expect("ls"),
        None,
        "nothing was saved"
    );
}

/// Issue #17, item 5: while a process trains a run, a second `train` of it is refused at once
/// (before anything is written); once the first is done, it proceeds.
#[test]
fn a_run_being_trained_is_locked_against_a_second_trainer() {
    let ws = workspace();
    let (exp, text) = manifest(ws.path(), "smoke-grpo", &[]);
    let out = ws.path().join("a");
    let run = acpo::run::RunDir::of(&exp, &out);
    let held = acpo::run::lock::acquire(run.path(), acpo::run::lock::Wait::NoWait)
        .expect("lock")
        .expect("free");
    let err = train(&exp, &text, &options(&out, false, None)).expect_err("busy");
    assert!(matches!(err, TrainError::Busy { .. }), "{err}");
    assert!(
        !run.metrics().exists() && !run.manifest().exists(),
        "nothing written"
    );
    drop(held);
    train(&exp, &text, &options(&out, false, None)).expect("trains once free");
}

/// Issue #17, item 5: runs side by side that share a created model do not race on building it:
/// one builds, the others wait and then check what it built.
#[test]
fn runs_sharing_a_created_model_build_it_once_side_by_side() {
    let dir = tempfile::tempdir().expect("tmp");
    let (exp, _) = manifest(dir.path(), "smoke-grpo", &[]);
    let results: Vec<_> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..3)
            .map(|_| s.spawn(|| acpo::train::ensure_model(&exp, |_| {})))
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("thread"))
            .collect()
    });
    for r in results {
        r.expect("every run gets the model");
    }
    acpo::train::ensure_model(&exp, |_| panic!("built once: now only checked")).expect("reuse");
}

/// Issue #18 item 3 through the whole trainer, on the CPU: `dtype: bf16` runs (sampling, the
/// update, the critic) in bf16 arithmetic on fp32 masters; the checkpoints hold the fp32 masters
/// and fp32 AdamW moments, so a resumed bf16 run is bit-identical to an uninterrupted one.
#[test]
fn bf16_runs_keep_fp32_masters_and_resume_exactly() {
    let edits = [
        ("dtype: f32", "dtype: bf16"),
        ("total_steps: 3", "total_steps: 4"),
        ("eval_every: 2", "eval_every: 4"),
        ("checkpoint_every: 2", "checkpoint_every: 2"),
    ];
    let ws = workspace();
    let (exp, text) = manifest(ws.path(), "smoke-ppo-ac", &edits);
    let straight =
        train(&exp, &text, &options(&ws.path().join("a"), false, None)).expect("4 steps");
    train(&exp, &text, &options(&ws.path().join("b"), false, Some(2))).expect("2 steps");
    let resumed =
        train(&exp, &text, &options(&ws.path().join("b"), true, None)).expect("resume 2 more");
    let ckpt = straight.join("checkpoints/step_000004");
    for f in [
        "policy/model.safetensors",
        "critic/model.safetensors",
        "actor_optim.safetensors",
        "critic_optim.safetensors",
    ] {
        let tensors =
            candle_core::safetensors::load(ckpt.join(f), &candle_core::Device::Cpu).expect(f);
        // (the optimizer's step count `__steps` is two u32 halves)
        assert!(
            tensors
                .iter()
                .all(|(n, t)| n == "__steps" || t.dtype() == candle_core::DType::F32),
            "{f}: not fp32"
        );
        assert_eq!(
            std::fs::read(ckpt.join(f)).expect(f),
            std::fs::read(resumed.join("checkpoints/step_000004").join(f)).expect(f),
            "{f} differs after resume"
        );
    }
    let m = metrics(&straight);
    assert_eq!(m.len(), 4);
    assert!(
        m.iter()
            .all(|s| s["actor/entropy"].is_finite() && s["actor/pg_loss"].is_finite()),
        "{m:?}"
    );
    assert_eq!(without_timing(m), without_timing(metrics(&resumed)));
}

#[test]
fn gradient_checkpointing_trains_the_same_run_bit_for_bit() {
    // The actor (GRPO) and the critic (PPO-AC) through the trainer's own update path.
    for name in ["smoke-grpo", "smoke-ppo-ac"] {
        let ws = workspace();
        let (plain, text) = manifest(ws.path(), name, &[]);
        assert!(!plain.model.gradient_checkpointing);
        let (ckpt, ckpt_text) = manifest(
            ws.path(),
            name,
            &[(
                "  dtype: f32\n",
                "  dtype: f32\n  gradient_checkpointing: true\n",
            )],
        );
        let a = train(&plain, &text, &options(&ws.path().join("a"), false, None)).expect("plain");
        let b = train(
            &ckpt,
            &ckpt_text,
            &options(&ws.path().join("b"), false, None),
        )
        .expect("checkpointed");
        assert_eq!(
            without_timing(metrics(&a)),
            without_timing(metrics(&b)),
            "{name}: metrics differ"
        );
        assert!(ckpt.model.gradient_checkpointing);
        let last = |d: &Path| {
            let (step, dir) = acpo::run::RunDir::at(d)
                .latest_checkpoint()
                .expect("ls")
                .expect("a checkpoint");
            let weights = dir.path().join("policy/model.safetensors");
            (step, std::fs::read(weights).expect("weights"))
        };
        assert_eq!(last(&a), last(&b), "{name}: the trained weights differ");
    }
}

/// `model.layer_backward: by-hand` (issue #59) trains the checkpointed run through the trainer's
/// own update path, the actor (GRPO) and the critic (PPO-AC): its first step, whose rollouts
/// are the same bits, has the autograd step's metrics to f32 round-off (the by-hand layer's
/// gradients are autograd's to round-off, tests/it/model.rs), every step's are finite, and some
/// move in their last bits (the path ran). A choice the run records: a fingerprint of its own, while the defaults written are the run
/// without them. By hand without checkpointing is refused, naming the field.
#[test]
fn the_layer_backward_by_hand_trains_the_checkpointed_run_to_round_off() {
    let ckpt = (
        "  dtype: f32\n",
        "  dtype: f32\n  gradient_checkpointing: true\n",
    );
    for name in ["smoke-grpo", "smoke-ppo-ac"] {
        let ws = workspace();
        let (autograd, text) = manifest(ws.path(), name, &[ckpt]);
        let by_hand_edit = (
            "  dtype: f32\n",
            "  dtype: f32\n  gradient_checkpointing: true\n  layer_backward: by-hand\n",
        );
        let (by_hand, by_hand_text) = manifest(ws.path(), name, &[by_hand_edit]);
        assert_eq!(
            by_hand.model.layer_backward,
            Some(acpo::model::spec::LayerBackward::ByHand)
        );
        assert!(
            by_hand
                .model
                .train_kernels(&candle_core::Device::Cpu)
                .layer_by_hand
        );
        assert!(
            !autograd
                .model
                .train_kernels(&candle_core::Device::Cpu)
                .layer_by_hand
        );
        assert_ne!(by_hand.fingerprint(), autograd.fingerprint());
        let defaults = (
            "  dtype: f32\n",
            "  dtype: f32\n  gradient_checkpointing: true\n  layer_backward: autograd\n  attention_backward: pair\n",
        );
        let (written, _) = manifest(ws.path(), name, &[defaults]);
        assert_eq!(written.fingerprint(), autograd.fingerprint());

        let a = train(
            &autograd,
            &text,
            &options(&ws.path().join("a"), false, None),
        )
        .expect("autograd");
        let b = train(
            &by_hand,
            &by_hand_text,
            &options(&ws.path().join("b"), false, None),
        )
        .expect("by hand");
        let (ma, mb) = (without_timing(metrics(&a)), without_timing(metrics(&b)));
        assert_eq!(ma.len(), mb.len(), "{name}: steps");
        assert_eq!(
            ma[0].keys().collect::<Vec<_>>(),
            mb[0].keys().collect::<Vec<_>>()
        );
        for (k, x) in &ma[0] {
            let y = mb[0][k];
            assert!(
                (x - y).abs() <= 1e-4 * x.abs().max(y.abs()) + 1e-6,
                "{name}: step 1's {k}: autograd {x}, by hand {y}"
            );
        }
        assert!(
            mb.iter().flat_map(|m| m.values()).all(|v| v.is_finite()),
            "{name}: {mb:?}"
        );
        // The by-hand path did run, for the actor and for the critic: an autograd run's
        // metrics are the same to the bit from one run to the next, and by hand moves the
        // PPO-AC run's first gradient norms in their last bits (GRPO's tiny step happens to
        // keep its bits).
        if name == "smoke-ppo-ac" {
            for k in ["actor/grad_norm", "critic/grad_norm"] {
                assert_ne!(
                    ma[0][k].to_bits(),
                    mb[0][k].to_bits(),
                    "{name}: step 1's {k} has autograd's bits: did the trainer take the backward by hand?"
                );
            }
        }
    }
    let text = std::fs::read_to_string(repo().join("experiments/smoke/smoke-grpo.yaml"))
        .expect("manifest")
        .replace(
            "  dtype: f32\n",
            "  dtype: f32\n  layer_backward: by-hand\n",
        );
    let err = Experiment::from_yaml(&text, Path::new("smoke-grpo.yaml"))
        .expect_err("by hand without checkpointing")
        .to_string();
    assert!(
        err.contains("model.layer_backward") && err.contains("gradient_checkpointing"),
        "{err}"
    );
}

#[test]
fn the_paged_kv_layout_trains_the_same_run_bit_for_bit() {
    // `kv_layout: paged` samples the rollouts, the PPO types' difficulty probe and the
    // evaluations over the paged KV cache; on the CPU it gives the dense engine's bits, so the
    // run is the same to the last bit: its metrics, its evaluations and its weights.
    for name in ["smoke-grpo", "smoke-ppo"] {
        let ws = workspace();
        let (dense, text) = manifest(ws.path(), name, &[]);
        assert_eq!(dense.kv_layout, None);
        assert_eq!(dense.kv_layout(), acpo::rollout::KvLayout::Dense);
        let (paged, paged_text) = manifest(
            ws.path(),
            name,
            &[("\ndevice: cpu\n", "\ndevice: cpu\nkv_layout: paged\n")],
        );
        assert_eq!(paged.kv_layout(), acpo::rollout::KvLayout::Paged);
        // A choice the run records: a run directory of its own.
        assert_ne!(paged.fingerprint(), dense.fingerprint());
        let a = train(&dense, &text, &options(&ws.path().join("a"), false, None)).expect("dense");
        let b = train(
            &paged,
            &paged_text,
            &options(&ws.path().join("b"), false, None),
        )
        .expect("paged");
        assert_eq!(
            without_timing(metrics(&a)),
            without_timing(metrics(&b)),
            "{name}: metrics differ"
        );
        // The rollouts did go through the paged engine: a GRPO group's n copies of a prompt
        // are prefilled once there, n times by the dense engine.
        let prefilled = |d: &Path| -> Vec<f64> {
            metrics(d)
                .iter()
                .map(|m| m["perf/tokens_per_s/gen_prefill"] * m["timing_s/gen_prefill"])
                .collect()
        };
        let n = dense.rollout.n as f64;
        for (d, p) in prefilled(&a).into_iter().zip(prefilled(&b)) {
            assert!(
                d > 0.0 && (d / p - n).abs() < 1e-6,
                "{name}: {d} vs {p}, n {n}"
            );
        }
        let evals = |d: &Path| std::fs::read_to_string(d.join("eval.jsonl")).expect("eval.jsonl");
        assert!(evals(&a).lines().count() >= 2, "{name}: evaluations");
        assert_eq!(evals(&a), evals(&b), "{name}: evaluations differ");
        let weights = |d: &Path| {
            let (_, dir) = acpo::run::RunDir::at(d)
                .latest_checkpoint()
                .expect("ls")
                .expect("a checkpoint");
            std::fs::read(dir.path().join("policy/model.safetensors")).expect("weights")
        };
        assert_eq!(
            weights(&a),
            weights(&b),
            "{name}: the trained weights differ"
        );
    }
}

/// Issue #23: the clipping family trains through the same code path at smoke scale, each
/// logging verl's clip metrics (PPO types: the critic's advantages are non-zero even where the
/// tiny model solves nothing); GSPO at its published bounds (3e-4 / 4e-4) clips sequences once
/// the second epoch is off-policy, the unclipped control never clips.
#[test]
fn cispo_gspo_and_the_unclipped_control_train_and_log_their_clip_fractions() {
    let ws = workspace();
    let ratio = "  clip_ratio_low: 0.2\n  clip_ratio_high: 0.2\n  clip_ratio_c: 3.0\n";
    let cases = [
        (
            "cispo",
            "  policy_loss: cispo\n  clip_ratio_low: 0.2\n  clip_ratio_high: 0.28\n",
        ),
        (
            "gspo",
            "  policy_loss: gspo\n  clip_ratio_low: 3.0e-4\n  clip_ratio_high: 4.0e-4\n",
        ),
        ("unclipped", "  policy_loss: unclipped\n"),
    ];
    let mut clipped = Vec::new();
    for (mode, algorithm) in cases {
        let edits = [(ratio, algorithm), ("epochs: 1", "epochs: 2")];
        let (exp, text) = manifest(ws.path(), "smoke-ppo", &edits);
        let dir = train(&exp, &text, &options(&ws.path().join(mode), false, None))
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        let m = metrics(&dir);
        for l in &m {
            assert!(l["actor/pg_loss"].is_finite(), "{mode}: {l:?}");
            assert!((0.0..=1.0).contains(&l["actor/pg_clipfrac"]), "{mode}");
            assert_eq!(l["actor/pg_clipfrac_lower"], 0.0, "{mode}: no dual clip");
            // Both paper rules' disagreement is still measured on its batches.
            assert!(l["actor/clip_disagree_ratio_zeroes"] >= 0.0);
        }
        clipped.push(m.iter().map(|l| l["actor/pg_clipfrac"]).sum::<f64>());
    }
    assert!(clipped[1] > 0.0, "GSPO at 3e-4 clips: {clipped:?}");
    assert_eq!(clipped[2], 0.0, "the control never clips");
}

/// Live memory stays flat across the layers of the checkpointed backward (issue #44): the
/// `acpo` binary (whose allocator is counted, `device::Counting`) traces a train step of a
/// six-layer model on the CPU, and from one layer's end to the next the bytes in use change by
/// exactly what the algorithm says (that layer's gradients join the sums, the next layer's kept
/// input goes), to within a hundredth of one layer's activations, while each layer's peak above
/// its start is the same. A backward that kept a layer's graph alive (the measured H100 binary
/// of 2026-11-23 kept every layer's gradient store, each hanging on its recompute) grows by a
/// whole layer's activations a layer, fifty times the tolerance. The same holds with each
/// layer's backward by hand (`--layer-by-hand`, issue #59), whose trace splits the backward
/// into each kind of work (issue #59 item 4).
#[test]
fn the_checkpointed_backward_holds_one_layers_activations_at_a_time() {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg_json = serde_json::json!({
        "model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true, "max_position_embeddings": 4096, "hidden_act": "silu",
    });
    let config = dir.path().join("config.json");
    std::fs::write(&config, cfg_json.to_string()).expect("config");
    // Each layer's time is split into its parts (`device::part`). Under autograd: the
    // recompute's matrix products, flash attention and element-wise passes, the seed, the
    // attention's backward kernels and the rest of the backward. By hand: the backward's matrix
    // products, element-wise passes and the weights' gradients handed to their masters apart
    // too, and no part left as "the rest" (what the flash backward calls the rest before its
    // kernels is the seed's own backward there, element-wise).
    let autograd = [
        acpo::device::FORWARD_MATMUL,
        acpo::device::FORWARD_ELEMENTWISE,
        acpo::device::FORWARD_ATTENTION,
        acpo::device::SEED,
        acpo::device::BACKWARD_ATTENTION,
        acpo::device::BACKWARD_REST,
    ];
    let by_hand = [
        acpo::device::FORWARD_MATMUL,
        acpo::device::FORWARD_ELEMENTWISE,
        acpo::device::FORWARD_ATTENTION,
        acpo::device::SEED,
        acpo::device::BACKWARD_ATTENTION,
        acpo::device::BACKWARD_MATMUL,
        acpo::device::BACKWARD_ELEMENTWISE,
        acpo::device::TO_MASTERS,
    ];
    for (extra, parts) in [
        (None, &autograd[..]),
        (Some("--layer-by-hand"), &by_hand[..]),
    ] {
        let out_dir = dir.path().join(format!("out{}", extra.unwrap_or("")));
        flat_layers(&config, extra, parts, &out_dir);
    }
}

/// One traced step of the six-layer model at `config` (with `extra`, a flag): each layer's
/// mark has exactly the parts `parts`, and the bytes in use stay flat (the test above).
fn flat_layers(
    config: &std::path::Path,
    extra: Option<&str>,
    parts_wanted: &[&str],
    out_dir: &std::path::Path,
) {
    let (b, t, h) = (2usize, 256usize, 64usize);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["bench", "train-step", "--device", "cpu", "--seq-len", "256"])
        .args([
            "--prompt-len",
            "8",
            "--micro-batch",
            "2",
            "--checkpointing",
            "--trace",
        ])
        .args([
            "--attention",
            "flash",
            "--vocab-chunk",
            "64",
            "--repeats",
            "1",
        ])
        .args(extra)
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out_dir)
        .output()
        .expect("acpo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("train-step.json")).expect("report"),
    )
    .expect("json");
    let r = &report[0];
    assert_eq!(
        r["memory"]["source"], "heap bytes in use (counting allocator)",
        "the binary's allocator is not counted"
    );
    let marks = r["trace"].as_array().expect("a trace");
    let at = |i: usize| -> (i64, i64) {
        let m = &marks[i];
        (
            m["live"].as_i64().expect("live"),
            m["peak"].as_i64().expect("peak"),
        )
    };
    let layers: Vec<usize> = (0..marks.len())
        .filter(|&i| {
            marks[i]["phase"]
                .as_str()
                .is_some_and(|p| p.starts_with("layer "))
        })
        .collect();
    assert_eq!(layers.len(), 6, "{extra:?}: one mark a layer");
    for &i in &layers {
        let parts = marks[i]["parts"].as_array().expect("the layer's parts");
        let mut names: Vec<&str> = parts.iter().filter_map(|p| p["name"].as_str()).collect();
        names.sort_unstable();
        let mut want = parts_wanted.to_vec();
        want.sort_unstable();
        assert_eq!(names, want, "{extra:?}: layer mark {i}'s parts");
        let summed: f64 = parts.iter().filter_map(|p| p["seconds"].as_f64()).sum();
        let secs = marks[i]["seconds"].as_f64().expect("seconds");
        assert!(
            summed <= secs + 1e-9,
            "{extra:?}: parts {summed} s of a layer of {secs} s"
        );
    }
    let qcfg = acpo::model::QwenConfig::load(config).expect("config");
    let layer_params: usize = acpo::model::init::layout(&qcfg)
        .iter()
        .filter(|(name, _, _)| name.starts_with("model.layers.0."))
        .map(|(_, shape, _)| shape.iter().product::<usize>())
        .sum();
    // Each layer's activations: its peak above the bytes in use when it started. The first
    // layer backpropagated also leaves what the rest of the step keeps (once, not a layer: two
    // (B, T, H) tensors and a few bytes here, 6 % of a layer), so the steady state is read from
    // the second layer on, and the first is held to those two tensors and 1 % above it.
    let activations: Vec<i64> = layers.iter().map(|&i| at(i).1 - at(i - 1).0).collect();
    let tolerance = activations[1] / 100;
    assert!(tolerance > 0);
    for a in &activations[1..] {
        assert!(
            (a - activations[1]).abs() <= tolerance,
            "{extra:?}: the layers' activations differ: {activations:?}"
        );
    }
    let kept_once = (2 * b * t * h * 4) as i64;
    assert!(
        activations[0] - activations[1] <= kept_once + tolerance,
        "{extra:?}: the first layer's backward holds more than the others': {activations:?}"
    );
    let expected = (4 * layer_params) as i64 - (b * t * h * 4) as i64;
    for pair in layers[1..].windows(2) {
        let grew = at(pair[1]).0 - at(pair[0]).0;
        assert!(
            (grew - expected).abs() <= tolerance,
            "{extra:?}: from {} to {} the bytes in use grew by {grew}, not the {expected} of a \
             layer's gradients less its input (tolerance {tolerance}; a layer's activations {})",
            marks[pair[0]]["phase"],
            marks[pair[1]]["phase"],
            activations[0]
        );
    }
}

/// Runs of one start model, evaluation and seed share their step-0 evaluation in one process
/// (`reproduce` and `sweep`, [`acpo::train::StartEvals`]): each run's eval.jsonl is byte for
/// byte what it is when the run evaluates on its own, and another seed evaluates anew.
#[test]
fn a_shared_step_zero_evaluation_leaves_every_run_as_it_was() {
    let ws = workspace();
    let shared = std::sync::Arc::new(acpo::train::StartEvals::new());
    let runs = [
        ("smoke-ppo", "seed: 1"),
        ("smoke-grpo-ac", "seed: 1"),
        ("smoke-ppo-ac", "seed: 2"),
    ];
    for (name, seed) in runs {
        let (exp, text) = manifest(ws.path(), name, &[("seed: 1\n", &format!("{seed}\n"))]);
        let own = train(
            &exp,
            &text,
            &options(&ws.path().join("own"), false, Some(1)),
        )
        .expect("trains");
        let opts = TrainOptions {
            start_evals: Some(shared.clone()),
            ..options(&ws.path().join("shared"), false, Some(1))
        };
        let with_shared = train(&exp, &text, &opts).expect("trains");
        let read = |dir: &Path| std::fs::read(dir.join("eval.jsonl")).expect("eval.jsonl");
        assert!(!read(&own).is_empty());
        assert_eq!(read(&own), read(&with_shared), "{name} ({seed})");
    }
    // smoke-ppo's evaluation at seed 1 served smoke-grpo-ac's; seed 2 made its own.
    assert_eq!(shared.counts(), (2, 1));
}
