//! Manifests: the paper's values, every validation rule, and the fingerprint.

use std::path::{Path, PathBuf};

use acpo::algo::clip::PolicyClip;
use acpo::algo::method::{AdvantageEstimator, AlgorithmKind};
use acpo::data::Benchmark;
use acpo::hub::ModelSource;
use acpo::manifest::{raw, Experiment, Scale};
use serde_json::Value;

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn load(rel: &str) -> Experiment {
    Experiment::load(&repo_path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The paper's appendix table "RL training hyperparameters" (+ Section 5 for evaluation),
/// transcribed once: (model, algorithm) -> the values it fixes.
struct PaperRow {
    repo: &'static str,
    algo: AlgorithmKind,
    batch: usize,
    n: usize,
    mini: usize,
    lr: f64,
    critic_lr: Option<f64>,
    steps: usize,
    clip: PolicyClip,
    k: usize,
}

fn paper_table() -> Vec<(&'static str, PaperRow)> {
    let ppo = PolicyClip::Ratio {
        eps_low: 0.2,
        eps_high: 0.2,
        dual_clip_c: 3.0,
    };
    let grpo = PolicyClip::Ratio {
        eps_low: 0.2,
        eps_high: 0.28,
        dual_clip_c: 3.0,
    };
    let mut rows = Vec::new();
    for (key, repo, k) in [
        ("qwen2.5-math-7b", "Qwen/Qwen2.5-Math-7B", 32),
        ("qwen3-1.7b", "Qwen/Qwen3-1.7B", 16),
        ("qwen3-4b", "Qwen/Qwen3-4B", 16),
        ("qwen3-8b", "Qwen/Qwen3-8B", 16),
    ] {
        let q25 = key.starts_with("qwen2.5");
        // Note b of the table: actor lr 5e-7 for Qwen3-1.7B PPO-type.
        let ppo_lr = if key == "qwen3-1.7b" { 5e-7 } else { 1e-6 };
        let (g_batch, g_n, g_mini, g_steps, g_alpha) = if q25 {
            (512, 8, 128, 200, 3.0)
        } else {
            (256, 4, 64, 100, 2.0)
        };
        for (algo, row) in [
            (
                AlgorithmKind::Ppo,
                (512, 1, 128, ppo_lr, Some(1e-5), 300, ppo),
            ),
            (
                AlgorithmKind::PpoAc,
                (
                    512,
                    1,
                    128,
                    ppo_lr,
                    Some(1e-5),
                    300,
                    PolicyClip::Advantage { alpha: 3.0 },
                ),
            ),
            (
                AlgorithmKind::Grpo,
                (g_batch, g_n, g_mini, 1e-6, None, g_steps, grpo),
            ),
            (
                AlgorithmKind::GrpoAc,
                (
                    g_batch,
                    g_n,
                    g_mini,
                    1e-6,
                    None,
                    g_steps,
                    PolicyClip::Advantage { alpha: g_alpha },
                ),
            ),
        ] {
            let (batch, n, mini, lr, critic_lr, steps, clip) = row;
            rows.push((
                key,
                PaperRow {
                    repo,
                    algo,
                    batch,
                    n,
                    mini,
                    lr,
                    critic_lr,
                    steps,
                    clip,
                    k,
                },
            ));
        }
    }
    rows
}

fn assert_paper_row(e: &Experiment, row: &PaperRow) {
    let ctx = &e.name;
    assert_eq!(e.scale, Scale::Paper, "{ctx}");
    assert_eq!(
        e.model.source,
        ModelSource::Hub {
            repo: row.repo.into(),
            revision: "main".into()
        },
        "{ctx}"
    );
    assert_eq!(e.algorithm.kind, row.algo, "{ctx}");
    assert_eq!(e.algorithm.clip, row.clip, "{ctx}");
    assert_eq!(e.trainer.batch_size, row.batch, "{ctx}: prompt batch size");
    assert_eq!(e.rollout.n, row.n, "{ctx}: rollouts per prompt");
    assert_eq!(e.actor.mini_batch_size, row.mini, "{ctx}: mini-batch");
    assert_eq!(e.actor.optim.lr, row.lr, "{ctx}: actor lr");
    assert_eq!(
        e.critic.map(|c| c.optim.lr),
        row.critic_lr,
        "{ctx}: critic lr"
    );
    assert_eq!(e.trainer.total_steps, row.steps, "{ctx}: total steps");
    // "Total optimizer steps" row of the table: 4 per training step everywhere.
    assert_eq!(
        e.actor.updates_per_step(e.trainer.batch_size) * e.trainer.total_steps,
        row.steps * 4,
        "{ctx}"
    );
    assert_eq!(
        (e.data.max_prompt_length, e.data.max_response_length),
        (1024, 8196),
        "{ctx}"
    );
    assert_eq!(
        (e.rollout.temperature, e.rollout.top_p, e.rollout.top_k),
        (1.0, 1.0, None),
        "{ctx}"
    );
    assert_eq!(e.actor.optim.grad_clip, 1.0, "{ctx}");
    assert_eq!(
        (
            e.actor.entropy_coeff,
            e.actor.kl_loss_coef,
            e.actor.use_kl_in_reward
        ),
        (0.0, 0.0, false),
        "{ctx}"
    );
    assert_eq!(e.eval.sampling.n, row.k, "{ctx}: Avg@k");
    assert_eq!(
        (
            e.eval.sampling.temperature,
            e.eval.sampling.top_p,
            e.eval.max_new_tokens
        ),
        (1.0, 1.0, 8196),
        "{ctx}"
    );
    assert_eq!(e.eval.benchmarks, Benchmark::ALL.to_vec(), "{ctx}");
    match e.algorithm.advantage {
        AdvantageEstimator::Gae { gamma, lam, whiten } => {
            assert!(row.algo.is_ppo_type());
            assert_eq!(
                (gamma, lam, whiten),
                (1.0, 1.0, true),
                "{ctx}: verl defaults"
            );
        }
        AdvantageEstimator::GroupNormalized { norm_by_std } => {
            assert!(!row.algo.is_ppo_type());
            assert!(norm_by_std, "{ctx}");
        }
    }
}

#[test]
fn the_sixteen_paper_manifests_carry_the_appendix_values() {
    let table = paper_table();
    assert_eq!(table.len(), 16);
    for (key, row) in &table {
        let e = load(&format!("experiments/paper/{key}-{}.yaml", row.algo));
        assert_paper_row(&e, row);
    }
}

#[test]
fn the_appendix_runs_use_lr_1e6_for_qwen3_1_7b_ppo_types() {
    for (file, algo) in [
        ("qwen3-1.7b-ppo-lr1e-6", AlgorithmKind::Ppo),
        ("qwen3-1.7b-ppo-ac-lr1e-6", AlgorithmKind::PpoAc),
    ] {
        let e = load(&format!("experiments/paper/appendix/{file}.yaml"));
        let (_, base) = paper_table()
            .into_iter()
            .find(|(k, r)| *k == "qwen3-1.7b" && r.algo == algo)
            .expect("row");
        assert_paper_row(&e, &PaperRow { lr: 1e-6, ..base });
    }
}

#[test]
fn every_manifest_in_experiments_is_valid_with_a_unique_name() {
    let files = acpo::manifest::discover(&repo_path("experiments")).expect("discover");
    assert!(files.len() >= 22, "found only {} manifests", files.len());
    let mut names = std::collections::BTreeSet::new();
    for f in &files {
        let e = Experiment::load(f).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            names.insert(e.name.clone()),
            "duplicate run name {}",
            e.name
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Validation rules: one bad example each, messages snapshot-tested.

fn base_value(rel: &str) -> Value {
    let text = std::fs::read_to_string(repo_path(rel)).expect("read");
    serde_saphyr::from_str::<Value>(&text).expect("YAML parses as a JSON value")
}

fn validate(value: Value) -> Result<Experiment, acpo::manifest::ManifestError> {
    let raw: raw::Manifest = serde_json::from_value(value).expect("still the raw shape");
    Experiment::validate(raw, Path::new("bad.yaml"))
}

/// Sets (or with `Value::Null` where a field is optional, removes) the value at a dotted path.
fn set(mut v: Value, path: &str, new: Value) -> Value {
    let mut cur = &mut v;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        cur = cur
            .get_mut(*p)
            .unwrap_or_else(|| panic!("no {p} in {path}"));
    }
    let obj = cur.as_object_mut().expect("object");
    let last = parts[parts.len() - 1];
    if new.is_null() {
        obj.remove(last);
    } else {
        obj.insert(last.to_string(), new);
    }
    v
}

#[test]
fn every_validation_rule_rejects_its_bad_example_with_one_clear_message() {
    use serde_json::json;
    let ppo = || base_value("experiments/paper/qwen3-8b-ppo.yaml");
    let grpo_ac = || base_value("experiments/paper/qwen3-8b-grpo-ac.yaml");
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "bad run name",
            set(ppo(), "name", json!("Qwen3 8B")),
            "name",
        ),
        (
            "empty description",
            set(ppo(), "description", json!("  ")),
            "description",
        ),
        (
            "repo and dir",
            set(ppo(), "model.dir", json!("/models/x")),
            "model",
        ),
        (
            "neither repo nor dir",
            set(ppo(), "model.repo", Value::Null),
            "model",
        ),
        (
            "malformed repo id",
            set(ppo(), "model.repo", json!("Qwen3-8B")),
            "model.repo",
        ),
        (
            "repo without revision",
            set(ppo(), "model.revision", Value::Null),
            "model.revision",
        ),
        (
            "revision with dir",
            set(
                set(ppo(), "model.repo", Value::Null),
                "model.dir",
                json!("m"),
            ),
            "model.revision",
        ),
        (
            "alpha on a baseline",
            set(ppo(), "algorithm.alpha", json!(3.0)),
            "algorithm.alpha",
        ),
        (
            "ratio clip on -AC",
            set(grpo_ac(), "algorithm.clip_ratio_low", json!(0.2)),
            "algorithm.clip_ratio_low",
        ),
        (
            "missing alpha",
            set(grpo_ac(), "algorithm.alpha", Value::Null),
            "algorithm.alpha",
        ),
        (
            "alpha not positive",
            set(grpo_ac(), "algorithm.alpha", json!(0.0)),
            "algorithm.alpha",
        ),
        (
            "eps_low out of range",
            set(ppo(), "algorithm.clip_ratio_low", json!(1.0)),
            "algorithm.clip_ratio_low",
        ),
        (
            "eps_high negative",
            set(ppo(), "algorithm.clip_ratio_high", json!(-0.1)),
            "algorithm.clip_ratio_high",
        ),
        (
            "missing eps_high",
            set(ppo(), "algorithm.clip_ratio_high", Value::Null),
            "algorithm.clip_ratio_high",
        ),
        (
            "dual clip <= 1",
            set(ppo(), "algorithm.clip_ratio_c", json!(1.0)),
            "algorithm.clip_ratio_c",
        ),
        // Issue #23: the clipping family.
        (
            "policy loss on -AC",
            set(grpo_ac(), "algorithm.policy_loss", json!("cispo")),
            "algorithm.policy_loss",
        ),
        (
            "dual clip with cispo",
            set(ppo(), "algorithm.policy_loss", json!("cispo")),
            "algorithm.clip_ratio_c",
        ),
        (
            "gspo without eps_low",
            set(
                set(
                    set(ppo(), "algorithm.policy_loss", json!("gspo")),
                    "algorithm.clip_ratio_c",
                    Value::Null,
                ),
                "algorithm.clip_ratio_low",
                Value::Null,
            ),
            "algorithm.clip_ratio_low",
        ),
        (
            "a ratio bound on the unclipped control",
            set(
                set(ppo(), "algorithm.policy_loss", json!("unclipped")),
                "algorithm.clip_ratio_c",
                Value::Null,
            ),
            "algorithm.clip_ratio_low",
        ),
        (
            "gamma > 1",
            set(ppo(), "algorithm.gamma", json!(1.5)),
            "algorithm.gamma",
        ),
        (
            "lam negative",
            set(ppo(), "algorithm.lam", json!(-0.5)),
            "algorithm.lam",
        ),
        (
            "GAE on GRPO",
            set(grpo_ac(), "algorithm.gamma", json!(1.0)),
            "algorithm.gamma",
        ),
        (
            "group std on PPO",
            set(ppo(), "algorithm.norm_adv_by_std_in_grpo", json!(true)),
            "algorithm.norm_adv_by_std_in_grpo",
        ),
        (
            "missing whitening",
            set(ppo(), "algorithm.whiten_advantages", Value::Null),
            "algorithm.whiten_advantages",
        ),
        (
            "zero prompt length",
            set(ppo(), "data.max_prompt_length", json!(0)),
            "data.max_prompt_length",
        ),
        ("zero n", set(ppo(), "rollout.n", json!(0)), "rollout.n"),
        (
            "GRPO with one rollout",
            set(grpo_ac(), "rollout.n", json!(1)),
            "rollout.n",
        ),
        (
            "greedy rollouts",
            set(ppo(), "rollout.temperature", json!(0.0)),
            "rollout.temperature",
        ),
        (
            "top_p > 1",
            set(ppo(), "rollout.top_p", json!(1.5)),
            "rollout.top_p",
        ),
        (
            "top_k zero",
            set(ppo(), "rollout.top_k", json!(0)),
            "rollout.top_k",
        ),
        (
            "lr zero",
            set(ppo(), "actor.optim.lr", json!(0.0)),
            "actor.optim.lr",
        ),
        (
            "lr huge",
            set(ppo(), "actor.optim.lr", json!(3.0)),
            "actor.optim.lr",
        ),
        (
            "grad clip zero",
            set(ppo(), "actor.optim.grad_clip", json!(0.0)),
            "actor.optim.grad_clip",
        ),
        (
            // Issue #17, item 4: 1e-50 is positive, but 0 in the f32 update (then 0/0).
            "eps that is zero in f32",
            set(ppo(), "actor.optim.eps", json!(1e-50)),
            "actor.optim.eps",
        ),
        (
            "weight decay negative",
            set(ppo(), "actor.optim.weight_decay", json!(-0.01)),
            "actor.optim.weight_decay",
        ),
        (
            "beta of 1",
            set(ppo(), "actor.optim.betas", json!([0.9, 1.0])),
            "actor.optim.betas[1]",
        ),
        (
            "adam eps zero",
            set(ppo(), "actor.optim.eps", json!(0.0)),
            "actor.optim.eps",
        ),
        (
            "warmup beyond the run",
            set(ppo(), "actor.optim.warmup_steps", json!(301)),
            "actor.optim.warmup_steps",
        ),
        // Issue #17, item 8: whatever `train` would refuse or turn into NaN, `check` refuses.
        (
            "critic warmup beyond the run",
            set(ppo(), "critic.optim.warmup_steps", json!(301)),
            "critic.optim.warmup_steps",
        ),
        (
            "KL loss without a reference policy",
            set(ppo(), "actor.kl_loss_coef", json!(0.1)),
            "actor.kl_loss_coef",
        ),
        (
            "KL in the reward without a reference policy",
            set(ppo(), "actor.use_kl_in_reward", json!(true)),
            "actor.use_kl_in_reward",
        ),
        (
            "entropy coefficient that swamps the loss",
            set(ppo(), "actor.entropy_coeff", json!(1e308)),
            "actor.entropy_coeff",
        ),
        (
            "temperature that overflows the logits",
            set(ppo(), "rollout.temperature", json!(1e-300)),
            "rollout.temperature",
        ),
        (
            "batch that cannot fit in memory",
            set(ppo(), "trainer.batch_size", json!(1_000_000_000_000u64)),
            "trainer.batch_size",
        ),
        (
            "samples per prompt that cannot fit in memory",
            set(grpo_ac(), "rollout.n", json!(100_000)),
            "rollout.n",
        ),
        (
            "warm-start learning rate that diverges",
            set(
                base_value("experiments/mini/mini-xs-grpo.yaml"),
                "model.init.warm_start.lr",
                json!(5.0),
            ),
            "model.init.warm_start.lr",
        ),
        (
            "mini-batch does not divide batch",
            set(ppo(), "actor.mini_batch_size", json!(100)),
            "actor.mini_batch_size",
        ),
        (
            "micro-batch does not divide mini-batch",
            set(ppo(), "actor.micro_batch_size", json!(7)),
            "actor.micro_batch_size",
        ),
        (
            "zero epochs",
            set(ppo(), "actor.epochs", json!(0)),
            "actor.epochs",
        ),
        (
            "negative entropy coefficient",
            set(ppo(), "actor.entropy_coeff", json!(-1.0)),
            "actor.entropy_coeff",
        ),
        (
            "negative KL coefficient",
            set(ppo(), "actor.kl_loss_coef", json!(-1.0)),
            "actor.kl_loss_coef",
        ),
        (
            "PPO without critic",
            set(ppo(), "critic", Value::Null),
            "critic",
        ),
        (
            "GRPO with critic",
            set(grpo_ac(), "critic", ppo()["critic"].clone()),
            "critic",
        ),
        (
            "critic lr zero",
            set(ppo(), "critic.optim.lr", json!(0.0)),
            "critic.optim.lr",
        ),
        (
            "value clip zero",
            set(ppo(), "critic.cliprange_value", json!(0.0)),
            "critic.cliprange_value",
        ),
        (
            "zero batch",
            set(ppo(), "trainer.batch_size", json!(0)),
            "trainer.batch_size",
        ),
        (
            "zero steps",
            set(ppo(), "trainer.total_steps", json!(0)),
            "trainer.total_steps",
        ),
        (
            "zero eval interval",
            set(ppo(), "trainer.eval_every", json!(0)),
            "trainer.eval_every",
        ),
        (
            "zero checkpoint interval",
            set(ppo(), "trainer.checkpoint_every", json!(0)),
            "trainer.checkpoint_every",
        ),
        (
            "no benchmarks",
            set(ppo(), "eval.benchmarks", json!([])),
            "eval.benchmarks",
        ),
        (
            "benchmark twice",
            set(ppo(), "eval.benchmarks", json!(["math500", "math500"])),
            "eval.benchmarks",
        ),
        ("zero k", set(ppo(), "eval.k", json!(0)), "eval.k"),
        (
            "negative eval temperature",
            set(ppo(), "eval.temperature", json!(-1.0)),
            "eval.temperature",
        ),
        (
            "eval top_p zero",
            set(ppo(), "eval.top_p", json!(0.0)),
            "eval.top_p",
        ),
        (
            "zero max new tokens",
            set(ppo(), "eval.max_new_tokens", json!(0)),
            "eval.max_new_tokens",
        ),
        (
            "zero limit",
            set(ppo(), "eval.limit", json!(0)),
            "eval.limit",
        ),
        (
            "paper scale on the cpu",
            set(ppo(), "device", json!("cpu")),
            "device",
        ),
        (
            "zero positions",
            set(ppo(), "model.max_position_embeddings", json!(0)),
            "model.max_position_embeddings",
        ),
    ];
    let mut report = String::new();
    for (what, value, field) in cases {
        let err = validate(value).expect_err(what);
        assert_eq!(err.field(), Some(field), "{what}: {err}");
        let msg = err.to_string();
        assert!(
            !msg.contains('\n'),
            "{what}: the message must be one line: {msg}"
        );
        report.push_str(&format!("{what}: {msg}\n"));
    }
    insta::assert_snapshot!("validation_messages", report);
}

/// Issue #23: the baselines' policy loss is selectable; vanilla is the default and the same
/// run as before (same fingerprint), the others parse to their rules.
#[test]
fn the_clipping_family_is_selected_by_policy_loss() {
    use serde_json::json;
    let ppo = base_value("experiments/paper/qwen3-8b-ppo.yaml");
    let plain = validate(ppo.clone()).expect("valid");
    let vanilla =
        validate(set(ppo.clone(), "algorithm.policy_loss", json!("vanilla"))).expect("vanilla");
    assert_eq!(vanilla.algorithm.clip, plain.algorithm.clip);
    let no_c = set(ppo.clone(), "algorithm.clip_ratio_c", Value::Null);
    let cispo = validate(set(no_c.clone(), "algorithm.policy_loss", json!("cispo"))).expect("ok");
    assert_eq!(
        cispo.algorithm.clip,
        PolicyClip::Cispo {
            eps_low: 0.2,
            eps_high: 0.2
        }
    );
    // CISPO as its authors and verl's example run it: no lower bound (ε_low 10), ε_high 0.2.
    let wide = validate(set(
        set(no_c.clone(), "algorithm.policy_loss", json!("cispo")),
        "algorithm.clip_ratio_low",
        json!(10.0),
    ))
    .expect("CISPO without a lower bound");
    assert_eq!(
        wide.algorithm.clip,
        PolicyClip::Cispo {
            eps_low: 10.0,
            eps_high: 0.2
        }
    );
    assert!(validate(set(ppo.clone(), "algorithm.clip_ratio_low", json!(10.0))).is_err());
    let gspo = validate(set(
        set(
            set(no_c.clone(), "algorithm.policy_loss", json!("gspo")),
            "algorithm.clip_ratio_low",
            json!(3e-4),
        ),
        "algorithm.clip_ratio_high",
        json!(4e-4),
    ))
    .expect("ok");
    assert_eq!(
        gspo.algorithm.clip,
        PolicyClip::Gspo {
            eps_low: 3e-4,
            eps_high: 4e-4
        }
    );
    let bare = set(
        set(no_c, "algorithm.clip_ratio_low", Value::Null),
        "algorithm.clip_ratio_high",
        Value::Null,
    );
    let unclipped = validate(set(bare, "algorithm.policy_loss", json!("unclipped"))).expect("ok");
    assert_eq!(unclipped.algorithm.clip, PolicyClip::Unclipped);
    let kinds = [&cispo, &gspo, &unclipped];
    for (i, a) in kinds.iter().enumerate() {
        assert_ne!(a.fingerprint(), plain.fingerprint());
        for b in &kinds[i + 1..] {
            assert_ne!(a.fingerprint(), b.fingerprint());
        }
    }
}

#[test]
fn parse_errors_name_the_file_line_and_field() {
    let text =
        std::fs::read_to_string(repo_path("experiments/paper/qwen3-8b-ppo.yaml")).expect("read");
    let cases = [
        (
            "unknown top-level field",
            text.replace("seed: 1 ", "sede: 1 "),
            "sede",
        ),
        (
            "unknown nested field",
            text.replace("    lr: 1.0e-5", "    lrr: 1.0e-5"),
            "critic.optim.lrr",
        ),
        (
            "wrong type",
            text.replace("  n: 1 ", "  n: one "),
            "rollout.n",
        ),
        (
            "unknown algorithm",
            text.replace("name: ppo\n", "name: trpo\n"),
            "algorithm.name",
        ),
        (
            "unknown policy loss (issue #23)",
            text.replace("name: ppo\n", "name: ppo\n  policy_loss: dual-clip\n"),
            "algorithm.policy_loss",
        ),
        (
            "quoted number",
            text.replace("seed: 1 ", "seed: \"1\" "),
            "seed",
        ),
        (
            "quoted boolean",
            text.replace(
                "gradient_checkpointing: true",
                "gradient_checkpointing: \"true\"",
            ),
            "model.gradient_checkpointing",
        ),
        (
            "unknown tag",
            text.replace("  n: 1 ", "  n: !big 1 "),
            "rollout.n",
        ),
        (
            "unknown KV-cache layout",
            text.replace("device: cuda\n", "device: cuda\nkv_layout: pagd\n"),
            "kv_layout",
        ),
        (
            "unknown layer backward (issue #59)",
            text.replace(
                "gradient_checkpointing: true",
                "gradient_checkpointing: true\n  layer_backward: by_hand",
            ),
            "model.layer_backward",
        ),
        (
            "unterminated quote",
            text.replace("name: ppo\n", "name: \"ppo\n"),
            "algorithm.name",
        ),
    ];
    let mut report = String::new();
    for (what, bad, field) in cases {
        let err = Experiment::from_yaml(&bad, Path::new("experiments/paper/qwen3-8b-ppo.yaml"))
            .expect_err(what);
        assert_eq!(err.field(), Some(field), "{what}: {err}");
        report.push_str(&format!("{what}: {err}\n"));
    }
    insta::assert_snapshot!("parse_messages", report);
}

#[test]
fn the_run_name_must_match_the_file_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text =
        std::fs::read_to_string(repo_path("experiments/paper/qwen3-8b-ppo.yaml")).expect("read");
    let path = dir.path().join("renamed.yaml");
    std::fs::write(&path, text).expect("write");
    let err = Experiment::load(&path).expect_err("name differs from the file");
    assert_eq!(err.field(), Some("name"));
}

// ---------------------------------------------------------------------------------------------
// Fingerprint.

/// Candidate replacements for a leaf; at least one must keep the manifest valid.
fn mutations(path: &str, leaf: &Value) -> Vec<Value> {
    use serde_json::json;
    let enum_alternatives: &[(&str, &[&str])] = &[
        ("scale", &["mini", "smoke"]),
        ("device", &["cpu", "auto"]),
        ("model.dtype", &["f32", "f16"]),
        (
            "algorithm.loss_agg_mode",
            &["token-mean-microbatch", "seq-mean-token-mean"],
        ),
        ("data.suite", &["synthetic"]),
        ("data.prompt_template", &["boxed", "raw"]),
        ("eval.prompt_template", &["dapo", "raw"]),
        ("trainer.reward", &["signed"]),
        ("kv_layout", &["dense"]),
    ];
    match leaf {
        Value::Bool(b) => vec![json!(!b)],
        Value::Number(n) => {
            let x = n.as_f64().expect("number");
            let mut out = vec![
                json!(x * 0.5),
                json!(x * 2.0),
                json!(x + 1.0),
                json!(x * 0.999),
            ];
            if n.is_u64() {
                let u = n.as_u64().expect("u64");
                out = vec![
                    json!(u * 2),
                    json!(u + 1),
                    json!(u / 2),
                    json!(u.saturating_sub(1)),
                ];
            }
            out
        }
        Value::String(s) => {
            if let Some((_, alts)) = enum_alternatives.iter().find(|(p, _)| *p == path) {
                return alts.iter().map(|a| json!(a)).collect();
            }
            vec![json!(format!("{s}x")), json!(format!("{s}/x"))]
        }
        _ => vec![],
    }
}

fn leaves(v: &Value, prefix: String, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, x)| {
            leaves(
                x,
                if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                },
                out,
            )
        }),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| leaves(x, format!("{prefix}.{i}"), out)),
        other => out.push((prefix, other.clone())),
    }
}

fn set_leaf(mut v: Value, path: &str, new: Value) -> Value {
    let mut cur = &mut v;
    for p in path.split('.') {
        cur = match cur {
            Value::Array(a) => &mut a[p.parse::<usize>().expect("index")],
            other => other.get_mut(p).expect("key"),
        };
    }
    *cur = new;
    v
}

#[test]
fn kv_layout_dense_is_the_default_written_or_not() {
    // The KV-cache layout is how the samplers hold their cache: absent or `dense`, the same
    // run and the same fingerprint (every manifest written before the field keeps its run
    // directory); `paged`, a run of its own.
    let base = base_value("experiments/paper/qwen3-8b-ppo.yaml");
    let fp = |v: Value| validate(v).expect("valid").fingerprint();
    let absent = validate(base.clone()).expect("valid");
    assert_eq!(absent.kv_layout, None);
    let dense = set(base.clone(), "kv_layout", serde_json::json!("dense"));
    assert_eq!(fp(dense), absent.fingerprint());
    let paged = validate(set(base, "kv_layout", serde_json::json!("paged"))).expect("valid");
    assert_eq!(paged.kv_layout(), acpo::rollout::KvLayout::Paged);
    assert_ne!(paged.fingerprint(), absent.fingerprint());
}

#[test]
fn changing_any_single_field_changes_the_fingerprint() {
    // Between them these two manifests set every field the schema has (ratio and advantage
    // clipping, GAE and group normalisation, the critic, the optional fields).
    let mut ppo = base_value("experiments/paper/qwen3-8b-ppo.yaml");
    ppo = set(ppo, "rollout.top_k", serde_json::json!(50));
    ppo = set(ppo, "eval.limit", serde_json::json!(100));
    ppo = set(ppo, "description", serde_json::json!("a run"));
    ppo = set(ppo, "actor.optim.warmup_steps", serde_json::json!(3));
    ppo = set(ppo, "kv_layout", serde_json::json!("paged"));
    let grpo_ac = base_value("experiments/paper/qwen3-8b-grpo-ac.yaml");
    let mut unchecked = Vec::new();
    let mut checked = 0;
    for base in [ppo, grpo_ac] {
        let fp = validate(base.clone()).expect("base valid").fingerprint();
        let mut ls = Vec::new();
        leaves(&base, String::new(), &mut ls);
        for (path, leaf) in ls {
            // The algorithm decides which other fields exist, and a benchmark cannot be swapped
            // without a duplicate: both are covered by the structural checks below.
            // `lr_schedule`, `kl_loss_coef` and `use_kl_in_reward` have a single valid value
            // today (the trainer keeps no reference policy), and so has `device` at the paper
            // scale (cuda).
            if leaf.is_null()
                || path == "algorithm.name"
                || path.starts_with("eval.benchmarks.")
                || path.ends_with("optim.lr_schedule")
                || path == "actor.kl_loss_coef"
                || path == "actor.use_kl_in_reward"
                || path == "device"
            {
                continue;
            }
            let changed = mutations(&path, &leaf).into_iter().any(|m| {
                let mutated = set_leaf(base.clone(), &path, m);
                serde_json::from_value::<raw::Manifest>(mutated.clone()).is_ok()
                    && validate(mutated).is_ok_and(|e| e.fingerprint() != fp)
            });
            if changed {
                checked += 1;
            } else {
                unchecked.push(path);
            }
        }
    }
    assert!(
        unchecked.is_empty(),
        "no valid single-field change altered the fingerprint for: {unchecked:?}"
    );
    assert!(checked > 60, "only {checked} leaves were checked");
    // Dropping a benchmark is the structural change of the list field.
    let base = base_value("experiments/paper/qwen3-8b-ppo.yaml");
    let fp = validate(base.clone()).expect("valid").fingerprint();
    let fewer = set(
        base,
        "eval.benchmarks",
        serde_json::json!(["math500", "minerva", "olympiadbench"]),
    );
    assert_ne!(validate(fewer).expect("valid").fingerprint(), fp);
    // Every committed run, and so every algorithm of a model, has its own fingerprint.
    let mut seen = std::collections::BTreeSet::new();
    for f in acpo::manifest::discover(&repo_path("experiments")).expect("discover") {
        assert!(
            seen.insert(Experiment::load(&f).expect("valid").fingerprint()),
            "{} repeats a fingerprint",
            f.display()
        );
    }
}

#[test]
fn comments_and_layout_do_not_change_the_fingerprint() {
    let path = repo_path("experiments/paper/qwen3-4b-grpo.yaml");
    let text = std::fs::read_to_string(&path).expect("read");
    let stripped: String = text
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim_end())
        .filter(|l| !l.trim_start().starts_with('#') && !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let a = Experiment::from_yaml(&text, &path).expect("valid");
    let b = Experiment::from_yaml(&stripped, &path).expect("valid");
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_eq!(a.fingerprint().len(), 64);
    assert_eq!(a.short_fingerprint(), a.fingerprint()[..12]);
}

/// Issue #17 item 8: a manifest whose sequences are longer than the model's positions is refused
/// by `check` where the model's config.json is on this machine (and by `train` once a hub model
/// is downloaded), naming the field; `model.max_position_embeddings` overrides the config's.
#[test]
fn sequences_longer_than_the_model_positions_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("experiments/smoke/tiny-qwen3.json")).expect("config"),
    )
    .expect("json");
    config["max_position_embeddings"] = serde_json::json!(50);
    let config_path = dir.path().join("short.json");
    std::fs::write(&config_path, config.to_string()).expect("write config");
    let text = std::fs::read_to_string(repo_path("experiments/smoke/smoke-ppo.yaml"))
        .expect("read")
        .replace(
            "config: experiments/smoke/tiny-qwen3.json",
            &format!("config: {}", config_path.display()),
        )
        .replace(
            "dir: models/smoke-qwen3-tiny",
            &format!("dir: {}", dir.path().join("absent").display()),
        );
    let manifest = dir.path().join("smoke-ppo.yaml");
    std::fs::write(&manifest, &text).expect("write");
    let err = Experiment::load(&manifest).expect_err("48 + 8 is more than 50 positions");
    assert_eq!(err.field(), Some("data.max_response_length"), "{err}");
    assert!(err.to_string().contains("short.json"), "{err}");
    // The same through `acpo check`: exit 2, the field named.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["check", manifest.to_str().expect("utf-8")])
        .output()
        .expect("run acpo");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("data.max_response_length")
            || String::from_utf8_lossy(&out.stderr).contains("data.max_response_length")
    );
    // An override the sequences fit in is accepted.
    let overridden = text.replace(
        "  dtype: f32\n",
        "  dtype: f32\n  max_position_embeddings: 4096\n",
    );
    std::fs::write(&manifest, overridden).expect("write");
    Experiment::load(&manifest).expect("fits the override");
}

/// `acpo reproduce --seeds`: a seed variant differs from its manifest in the run seed alone
/// (the created model's own seed stays), and its text parses back to it.
#[test]
fn a_seed_variant_changes_the_run_seed_and_nothing_else() {
    let path = repo_path("experiments/mini/mini-s-grpo-ac.yaml");
    let text = std::fs::read_to_string(&path).expect("read");
    let base = Experiment::load(&path).expect("base");
    let (varied, varied_text) = Experiment::with_seed(&text, base.seed + 4, &path).expect("seed");
    assert_eq!(varied.seed, base.seed + 4);
    assert_eq!(
        Experiment::from_yaml(&varied_text, &path).expect("parses"),
        varied
    );
    assert_eq!(
        Experiment {
            seed: base.seed,
            ..varied.clone()
        },
        base
    );
    assert_ne!(varied.fingerprint(), base.fingerprint());
    let diff: Vec<(&str, &str)> = text
        .lines()
        .zip(varied_text.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(diff, vec![("seed: 1", "seed: 5")]);
    // Only a top-level `seed:` line is a run seed; a nested one (model.init.seed) is not.
    let nested_only = text.replace("\nseed: 1\n", "\n");
    let err = Experiment::with_seed(&nested_only, 2, &path).expect_err("no run seed");
    assert!(err.to_string().contains("seed"), "{err}");
}

/// Every whole-number field has a declared range that `acpo check` enforces, naming the field
/// and the range (a warm start of 10^11 steps asked for 800 GB at its first line and aborted;
/// 10^12 epochs ran forever); counts each in range whose product no host holds are refused
/// the same way, naming the field that leads them. The shipped manifests pass
/// (`check_accepts_every_committed_manifest`).
#[test]
fn counts_outside_their_ranges_and_counts_no_host_holds_are_refused_by_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check = |value: Value| {
        let name = value["name"].as_str().expect("name").to_owned();
        let path = dir.path().join(format!("{name}.yaml"));
        // JSON is YAML: the edited manifest as the user would have written it
        std::fs::write(&path, serde_json::to_string(&value).expect("json")).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
            .args(["check", path.to_str().expect("utf-8")])
            .current_dir(repo_path(""))
            .output()
            .expect("run acpo");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mini = || base_value("experiments/mini/mini-xs-grpo.yaml");
    for (field, value, range) in [
        (
            "model.init.warm_start.steps",
            serde_json::json!(100_000_000_000u64),
            "[1, 16777216]",
        ),
        (
            "actor.epochs",
            serde_json::json!(1_000_000_000_000u64),
            "[1, 1024]",
        ),
        (
            "model.init.warm_start.batch_size",
            serde_json::json!(1_000_000_000_000u64),
            "[1, 65536]",
        ),
    ] {
        let (code, err) = check(set(mini(), field, value));
        assert_eq!(code, Some(2), "{field}: {err}");
        assert!(
            err.contains(&format!("field `{field}`")) && err.contains(range),
            "{field}: {err}"
        );
    }
    let (code, err) = check(mini());
    assert_eq!(code, Some(0), "the unedited manifest passes: {err}");
    // 2^16 prompts × 2^10 samples, each count in its range: petabytes of token ids.
    let mut huge = base_value("experiments/paper/qwen3-8b-grpo.yaml");
    for (field, value) in [
        ("trainer.batch_size", 65536),
        ("actor.mini_batch_size", 65536),
        ("rollout.n", 1024),
    ] {
        huge = set(huge, field, serde_json::json!(value));
    }
    let (code, err) = check(huge);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("field `trainer.batch_size`") && err.contains("GiB of memory"),
        "{err}"
    );
}
