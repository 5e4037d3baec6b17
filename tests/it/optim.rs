//! Our AdamW against PyTorch (tools/oracles/ref_adamw.py wrote tests/fixtures/adamw.json).

use std::collections::BTreeMap;

use acpo::model::Params;
use acpo::optim::{AdamW, Gradients};
use acpo::optim::{LrSchedule, OptimSpec};
use candle_core::{Device, Tensor, Var};
use serde_json::Value;

fn fixture() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/adamw.json"
        ))
        .expect("fixture"),
    )
    .expect("json")
}

fn flat(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(a) => a.iter().flat_map(flat).collect(),
        Value::Number(n) => vec![n.as_f64().expect("f") as f32],
        _ => panic!("not numeric"),
    }
}

fn tensor_like(v: &Value, shape: &[usize]) -> Tensor {
    Tensor::from_vec(flat(v), shape, &Device::Cpu).expect("tensor")
}

const SHAPES: [&[usize]; 2] = [&[3, 4], &[5]];
const NAMES: [&str; 2] = ["a.weight", "b.bias"];

fn setup(f: &Value) -> (Params, OptimSpec) {
    let c = &f["config"];
    let vars: BTreeMap<String, Var> = NAMES
        .iter()
        .zip(SHAPES)
        .enumerate()
        .map(|(i, (n, s))| {
            (
                n.to_string(),
                Var::from_tensor(&tensor_like(&f["init"][i], s)).expect("var"),
            )
        })
        .collect();
    let spec = OptimSpec {
        lr: c["lr"].as_f64().expect("lr"),
        lr_schedule: LrSchedule::Constant,
        warmup_steps: c["warmup"].as_u64().expect("w") as usize,
        grad_clip: c["clip"].as_f64().expect("clip"),
        weight_decay: c["weight_decay"].as_f64().expect("wd"),
        betas: [
            c["betas"][0].as_f64().expect("b1"),
            c["betas"][1].as_f64().expect("b2"),
        ],
        eps: c["eps"].as_f64().expect("eps"),
    };
    (Params::new(vars), spec)
}

fn grads_of(step: &Value) -> Gradients {
    Gradients::from_map(
        NAMES
            .iter()
            .zip(SHAPES)
            .enumerate()
            .map(|(i, (n, s))| (n.to_string(), tensor_like(&step["grads"][i], s)))
            .collect(),
    )
}

fn values(params: &Params) -> Vec<Vec<f32>> {
    params
        .vars()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .expect("f")
                .to_vec1::<f32>()
                .expect("v")
        })
        .collect()
}

#[test]
fn matches_pytorch_adamw_with_clipping_and_warmup_step_by_step() {
    let f = fixture();
    let (params, spec) = setup(&f);
    let mut opt = AdamW::new(&params, &spec).expect("adamw");
    for (s, step) in f["steps"].as_array().expect("steps").iter().enumerate() {
        let r = opt.step(&grads_of(step)).expect("step");
        assert!(r.applied);
        assert!(
            (r.grad_norm - step["grad_norm"].as_f64().expect("n")).abs()
                < 1e-4 * r.grad_norm.max(1.0),
            "step {s} norm"
        );
        assert!(
            (r.lr - step["lr"].as_f64().expect("lr")).abs() < 1e-12,
            "step {s} lr {}",
            r.lr
        );
        // BTreeMap order: a.weight, b.bias — the fixture's order.
        for (i, got) in values(&params).iter().enumerate() {
            let want = flat(&step["params"][i]);
            for (x, y) in got.iter().zip(&want) {
                assert!(
                    (x - y).abs() < 2e-6 * (1.0 + y.abs()),
                    "step {s} param {i}: {x} vs torch {y}"
                );
            }
        }
    }
    assert_eq!(opt.steps_taken(), 6);
}

#[test]
fn save_and_load_resume_bit_identically_and_non_finite_steps_are_skipped() {
    let f = fixture();
    let steps = f["steps"].as_array().expect("steps");
    let (straight, spec) = setup(&f);
    let mut opt = AdamW::new(&straight, &spec).expect("adamw");
    for s in steps {
        opt.step(&grads_of(s)).expect("step");
    }
    let dir = tempfile::tempdir().expect("tmp");
    let (resumed, _) = setup(&f);
    let mut first = AdamW::new(&resumed, &spec).expect("adamw");
    for s in &steps[..3] {
        first.step(&grads_of(s)).expect("step");
    }
    first
        .save(&dir.path().join("optim.safetensors"))
        .expect("save");
    resumed
        .save(&dir.path().join("model.safetensors"))
        .expect("save params");
    let reloaded =
        Params::load_dir(dir.path(), candle_core::DType::F32, &Device::Cpu).expect("reload");
    let mut second = AdamW::new(&reloaded, &spec).expect("adamw");
    second
        .load(&dir.path().join("optim.safetensors"))
        .expect("load");
    assert_eq!(second.steps_taken(), 3);
    for s in &steps[3..] {
        second.step(&grads_of(s)).expect("step");
    }
    assert_eq!(
        values(&straight),
        values(&reloaded),
        "resume must be bit-identical"
    );

    let before = values(&reloaded);
    let mut bad = grads_of(&steps[0]);
    bad.accumulate(Gradients::from_map(BTreeMap::from([(
        "b.bias".to_string(),
        Tensor::new(&[f32::NAN, 0.0, 0.0, 0.0, 0.0], &Device::Cpu).expect("t"),
    )])))
    .expect("acc");
    let r = second.step(&bad).expect("step");
    assert!(!r.applied && r.grad_norm.is_nan());
    assert_eq!(
        values(&reloaded),
        before,
        "a non-finite step changes nothing"
    );
    assert_eq!(second.steps_taken(), 6);
}

/// The whole-model CUDA step (kernels/adamw.cu) in the CPU emulator: the squared norm against a
/// float64 sum, every parameter and moment against the CPU twin's bits and a float64 AdamW,
/// over tensors around the chunk size, f32 and bf16 parameters, a missing gradient, clipped and
/// unclipped steps; a NaN gradient writes nothing, an overflow raises the flag (the GPU runs the
/// same kernels in tests/it/cuda.rs).
#[test]
fn the_cuda_step_matches_the_cpu_twin_bit_for_bit_in_the_emulator() {
    let Some(out) = super::kernels::run_emulated(
        "the_cuda_step_matches_the_cpu_twin_bit_for_bit_in_the_emulator",
        "adamw_check",
        &["--seeds", "2"],
    ) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("all checks ok"),
        "the emulated AdamW step fails its checks:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for what in ["(clipped)", "(unclipped)", "NaN gradient", "overflow"] {
        assert!(text.contains(what), "no check of `{what}` ran:\n{text}");
    }
}
