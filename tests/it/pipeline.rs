//! `acpo pipeline` (issue #34): a paper manifest derived into a random-weights run at its own
//! shapes, trained through the same trainer, reported phase by phase and costed.

use std::path::Path;

use acpo::hub::ModelSource;
use acpo::manifest::{Experiment, Scale};
use acpo::model::init::{InitTokenizer, TokenizerFiles};
use acpo::model::spec::LayerBackward;
use acpo::perf::pipeline::{derive, run_phases, Derivation};
use acpo::rollout::KvLayout;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn derivation(tokenizer: &Path, models: &Path) -> Derivation {
    Derivation {
        divisor: 64,
        steps: 1,
        eval_limit: 1,
        tokenizer: Some(tokenizer.to_owned()),
        configs: repo().join("experiments/paper/configs"),
        models: models.to_owned(),
        config: None,
        device: None,
        kv_layout: None,
        layer_backward: None,
        micro_batch: None,
    }
}

/// The derived manifest keeps everything a paper step costs (the lengths, n, the optimizer
/// steps per training step, the critic, the benchmarks) and changes only what the issue allows:
/// random weights of the same config with the real tokenizer, batch sizes divided, the steps,
/// the evaluation's problems; divisors that do not divide the batch sizes are refused naming the
/// field.
#[test]
fn a_paper_manifest_derives_into_a_random_weights_run_at_its_own_shapes() {
    let dir = tempfile::tempdir().expect("tmp");
    for name in [
        "qwen3-1.7b-grpo",
        "qwen3-1.7b-ppo",
        "qwen2.5-math-7b-ppo-ac",
    ] {
        let path = repo().join(format!("experiments/paper/{name}.yaml"));
        let text = std::fs::read_to_string(&path).expect("manifest");
        let paper = Experiment::from_yaml(&text, &path).expect("paper manifest");
        let d = derivation(Path::new("/tokenizer"), dir.path());
        let (exp, derived) = derive(&text, &path, &d).expect("derives");
        assert_eq!(exp.name, format!("{name}-random"));
        assert_eq!(exp.scale, Scale::Pipeline);
        assert!(derived.starts_with("# Derived by `acpo pipeline`"));
        assert_eq!(
            Experiment::from_yaml(&derived, &path).expect("re-reads"),
            exp
        );
        let init = exp.model.init.as_ref().expect("a created model");
        let stem = paper.model.source.label().to_lowercase();
        assert_eq!(
            init.config,
            repo().join(format!("experiments/paper/configs/{stem}.json"))
        );
        assert_eq!(
            init.tokenizer,
            Some(InitTokenizer::Files(TokenizerFiles::Dir {
                dir: "/tokenizer".into()
            }))
        );
        assert_eq!(exp.model.source, ModelSource::Dir(dir.path().join(&stem)));
        // what a step costs is kept
        assert_eq!(exp.data, paper.data);
        assert_eq!(exp.rollout, paper.rollout);
        assert_eq!(exp.algorithm, paper.algorithm);
        assert_eq!(exp.critic, paper.critic);
        assert_eq!(exp.model.dtype, paper.model.dtype);
        assert_eq!(
            exp.actor.updates_per_step(exp.trainer.batch_size),
            paper.actor.updates_per_step(paper.trainer.batch_size)
        );
        assert_eq!(exp.eval.benchmarks, paper.eval.benchmarks);
        assert_eq!(exp.eval.sampling, paper.eval.sampling);
        assert_eq!(exp.eval.max_new_tokens, paper.eval.max_new_tokens);
        // what the issue lets it change
        assert_eq!(exp.trainer.batch_size * 64, paper.trainer.batch_size);
        assert_eq!(exp.actor.mini_batch_size * 64, paper.actor.mini_batch_size);
        assert_eq!(exp.trainer.total_steps, 1);
        assert_eq!(exp.eval.limit, Some(1));
        assert!(!exp.trainer.evaluates_at_start());
        assert_eq!(exp.kv_layout, paper.kv_layout);
        // `acpo pipeline --paged-kv`: the samplers over the paged cache, nothing else changed
        let paged_d = Derivation {
            kv_layout: Some(KvLayout::Paged),
            ..d.clone()
        };
        let (paged, _) = derive(&text, &path, &paged_d).expect("derives paged");
        assert_eq!(paged.kv_layout(), KvLayout::Paged);
        assert_eq!(
            Experiment {
                kv_layout: None,
                ..paged
            },
            exp
        );
        // `acpo pipeline --layer-by-hand`: each layer's backward by hand, nothing else changed
        let by_hand_d = Derivation {
            layer_backward: Some(LayerBackward::ByHand),
            ..d.clone()
        };
        let (by_hand, _) = derive(&text, &path, &by_hand_d).expect("derives by hand");
        assert_eq!(by_hand.model.layer_backward, Some(LayerBackward::ByHand));
        let mut model = by_hand.model.clone();
        model.layer_backward = None;
        assert_eq!(Experiment { model, ..by_hand }, exp);
    }
    let path = repo().join("experiments/paper/qwen3-1.7b-grpo.yaml");
    let text = std::fs::read_to_string(&path).expect("manifest");
    let mut d = derivation(Path::new("/tokenizer"), dir.path());
    d.divisor = 3;
    let err = derive(&text, &path, &d).expect_err("256 / 3").to_string();
    assert!(
        err.contains("trainer.batch_size") && err.contains("--divisor 3"),
        "{err}"
    );
}

/// The derived GRPO and PPO runs of Qwen3-1.7B train a step on the CPU with a tiny model of the
/// full Qwen3 vocabulary (and, here only, short lengths), through the real tokenizer, data and
/// benchmarks: the metrics hold every phase's time and tokens under verl's names, the run has
/// its evaluation and checkpoint, and the report and the costed plan of the 16 paper runs come
/// out of them, through the binary too (`--report-only`).
#[test]
fn pipeline_runs_train_and_report_every_phase() {
    let test = "pipeline_runs_train_and_report_every_phase";
    let (Some(data), Some(tokenizer)) = (super::real_data(test), super::qwen3_tokenizer(test))
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let results = dir.path().join("results");
    let mut d = derivation(&tokenizer, &dir.path().join("models"));
    d.config = Some(repo().join("tests/fixtures/pipeline-qwen3.json"));
    d.device = Some(acpo::model::spec::Device::Cpu);
    let mut jobs = Vec::new();
    let mut names = Vec::new();
    for name in ["qwen3-1.7b-grpo", "qwen3-1.7b-ppo"] {
        let path = repo().join(format!("experiments/paper/{name}.yaml"));
        let text = std::fs::read_to_string(&path).expect("manifest");
        let (_, derived) = derive(&text, &path, &d).expect("derives");
        let mut short = derived;
        for (field, value) in [
            ("data.max_prompt_length", "48"),
            ("data.max_response_length", "6"),
            ("eval.max_new_tokens", "6"),
            ("eval.k", "2"),
        ] {
            short = acpo::manifest::edit::set_field(&short, field, value).expect(field);
        }
        let exp = Experiment::from_yaml(&short, &path).expect("short manifest");
        names.push((exp.clone(), name));
        jobs.push(acpo::reproduce::Job {
            exp,
            text: short,
            results: results.clone(),
        });
    }
    let location = acpo::data::DataLocation::Dir(data.clone());
    acpo::reproduce::train_runs(jobs, &location, Some(1)).expect("trains");
    let mut measured = Vec::new();
    for (exp, paper) in &names {
        let run = acpo::run::RunDir::of(exp, &results);
        let line = std::fs::read_to_string(run.metrics()).expect("metrics");
        let m: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(line.trim()).expect("one line");
        let mut phases = vec![
            "gen",
            "gen_prefill",
            "gen_decode",
            "reward",
            "old_log_prob",
            "adv",
            "update_actor",
            "testing",
            "save_checkpoint",
            "step",
        ];
        if exp.critic.is_some() {
            phases.extend(["values", "update_critic", "probe"]);
        }
        for p in phases {
            let t = m[&format!("timing_s/{p}")].as_f64().expect(p);
            assert!(t >= 0.0 && t.is_finite(), "{p}: {t}");
        }
        for p in ["gen_decode", "old_log_prob", "update_actor", "testing"] {
            assert!(
                m[&format!("perf/tokens_per_s/{p}")].as_f64().expect(p) > 0.0,
                "{p}"
            );
        }
        assert!(run.eval().exists() && run.latest_checkpoint().expect("io").is_some());
        let phases = run_phases(run.path(), exp, paper).expect("phases");
        assert_eq!(phases.steps, 1);
        assert_eq!(phases.responses, exp.trainer.batch_size * exp.rollout.n);
        assert_eq!(phases.kv_layout, exp.kv_layout());
        measured.push(phases);
    }
    let out = dir.path().join("report");
    acpo::perf::pipeline::pipeline_plan(
        &measured,
        &repo().join("experiments/paper"),
        &repo().join("experiments/paper/configs"),
        &out,
    )
    .expect("plan");
    let plan: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(out.join("pipeline-plan.json")).expect("plan json"))
            .expect("json");
    assert_eq!(plan.len(), 16, "every paper run is costed");
    for row in &plan {
        let (run, measured) = (
            row["run"].as_str().expect("run"),
            row["measured"].as_str().expect("m"),
        );
        // the same family: a critic's runs from the PPO run, the others from the GRPO run
        assert_eq!(
            run.contains("ppo"),
            measured.contains("ppo"),
            "{run} from {measured}"
        );
        let (limit, half) = (
            row["gpu_hours_at_limit"].as_f64().expect("h"),
            row["gpu_hours_at_half"].as_f64().expect("h"),
        );
        assert!(limit > half && half > 0.0, "{run}: {limit} {half}");
    }
    let md = acpo::perf::pipeline::markdown(&measured);
    assert!(
        md.contains("### qwen3-1.7b-grpo-random") && md.contains("| gen_decode |"),
        "{md}"
    );
    // each run says how its samplers held their KV cache (these: the manifests' dense)
    assert!(md.contains("of their limit; dense KV cache)"), "{md}");
    // `--report-only` reports the runs of exactly the derived manifests; these were trained
    // with shorter lengths, so the binary finds none and says so, naming the run
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args([
            "pipeline",
            "--report-only",
            "--steps",
            "1",
            "--device",
            "cpu",
        ])
        .arg(repo().join("experiments/paper/qwen3-1.7b-grpo.yaml"))
        .arg("--config")
        .arg(repo().join("tests/fixtures/pipeline-qwen3.json"))
        .arg("--tokenizer")
        .arg(&tokenizer)
        .arg("--models")
        .arg(dir.path().join("models"))
        .arg("--results")
        .arg(&results)
        .arg("--configs")
        .arg(repo().join("experiments/paper/configs"))
        .arg("--paper")
        .arg(repo().join("experiments/paper"))
        .output()
        .expect("acpo runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("qwen3-1.7b-grpo-random") && err.contains("without --report-only"),
        "{err}"
    );
}
