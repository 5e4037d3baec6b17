//! The CUDA kernels (kernels/*.cu) against their CPU twins, and the trainer on CUDA (issue #18).
//! Built everywhere; without the `cuda` feature or without a GPU each test says so and skips.
//!
//! Tolerances (relative L2 error against the CPU f32 result): f32 ≤ 1e-5, bf16 ≤ 1e-2. Inputs
//! are fresh random numbers at odd sizes; outputs are compared in full (a kernel that leaves an
//! element unwritten returns whatever the allocator held, which does not pass).

use candle_core::{DType, Device, Tensor, Var};

/// The GPU, or None after saying why the test is skipped.
fn gpu(test: &str) -> Option<Device> {
    if !cfg!(feature = "cuda") {
        super::skip(
            test,
            format_args!("this test binary was built without the `cuda` feature (just test-cuda)"),
        );
        return None;
    }
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            super::skip(test, format_args!("no CUDA GPU here ({e})"));
            None
        }
    }
}

fn random(seed: u64, shape: &[usize], std: f64) -> Tensor {
    let mut rng = acpo::rng::SplitMix64::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| (rng.next_normal() * std) as f32).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor")
}

/// ‖a − b‖ / ‖b‖ over all elements, in f64 on the CPU.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let flat = |t: &Tensor| -> Vec<f64> {
        t.to_device(&Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F64))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f64>())
            .expect("to host")
    };
    let (a, b) = (flat(a), flat(b));
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn tolerance(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        1e-5
    } else {
        1e-2
    }
}

/// Runs `op` on CPU f32 inputs and on the GPU in f32 and bf16, for values and the gradients of
/// every input (against a fixed random output gradient), and compares.
fn parity(
    what: &str,
    gpu: &Device,
    inputs: &[Tensor],
    grads_of: &[bool],
    op: impl Fn(&[Tensor]) -> Tensor,
) {
    let run = |device: &Device, dtype: DType| -> (Tensor, Vec<Option<Tensor>>) {
        let vars: Vec<Var> = inputs
            .iter()
            .map(|t| {
                Var::from_tensor(
                    &t.to_dtype(dtype)
                        .and_then(|t| t.to_device(device))
                        .expect("to"),
                )
                .expect("var")
            })
            .collect();
        let ts: Vec<Tensor> = vars
            .iter()
            .zip(grads_of)
            .map(|(v, g)| {
                if *g {
                    v.as_tensor().clone()
                } else {
                    v.as_tensor().detach()
                }
            })
            .collect();
        let y = op(&ts);
        let dy = random(99, y.dims(), 1.0)
            .to_dtype(y.dtype())
            .and_then(|t| t.to_device(device))
            .expect("dy");
        let grads = (&y * &dy)
            .and_then(|p| p.to_dtype(DType::F32))
            .and_then(|p| p.sum_all())
            .and_then(|l| l.backward())
            .expect("backward");
        let g = vars
            .iter()
            .zip(grads_of)
            .map(|(v, want)| want.then(|| grads.get(v.as_tensor()).expect("a gradient").clone()))
            .collect();
        (y, g)
    };
    let (y_cpu, g_cpu) = run(&Device::Cpu, DType::F32);
    for dtype in [DType::F32, DType::BF16] {
        let (y, g) = run(gpu, dtype);
        let e = rel_err(&y, &y_cpu);
        assert!(
            e <= tolerance(dtype),
            "{what} {dtype:?}: values off by {e:.2e}"
        );
        for (i, (a, b)) in g.iter().zip(&g_cpu).enumerate() {
            if let (Some(a), Some(b)) = (a, b) {
                let e = rel_err(a, b);
                assert!(
                    e <= tolerance(dtype),
                    "{what} {dtype:?}: gradient of input {i} off by {e:.2e}"
                );
            }
        }
    }
}

#[test]
fn rms_norm_swiglu_rope_and_attention_softmax_match_their_cpu_twins() {
    let Some(gpu) = gpu("rms_norm_swiglu_rope_and_attention_softmax_match_their_cpu_twins") else {
        return;
    };
    use acpo::fused;
    // (600, 128): the q/k norms' head dim, rows over two and a half chunks of the two-pass dw
    for (rows, n) in [
        (1usize, 7usize),
        (37, 130),
        (5, 1031),
        (3, 4096),
        (600, 128),
    ] {
        parity(
            &format!("rms_norm {rows}x{n}"),
            &gpu,
            &[random(1, &[rows, n], 1.0), random(2, &[n], 0.5)],
            &[true, true],
            |t| fused::rms_norm(&t[0], &t[1], 1e-6).expect("rms_norm"),
        );
        parity(
            &format!("swiglu {rows}x{n}"),
            &gpu,
            &[random(3, &[rows, n], 2.0), random(4, &[rows, n], 1.0)],
            &[true, true],
            |t| fused::swiglu(&t[0], &t[1]).expect("swiglu"),
        );
    }
    for (b, h, t, d) in [
        (1usize, 1usize, 1usize, 2usize),
        (2, 3, 17, 16),
        (1, 4, 65, 128),
    ] {
        let angles = random(5, &[b, 1, t, d / 2], 3.0);
        let angles = Tensor::cat(&[&angles, &angles], 3).expect("cat");
        parity(
            &format!("rope {b}x{h}x{t}x{d}"),
            &gpu,
            &[
                random(6, &[b, h, t, d], 1.0),
                angles.cos().expect("cos"),
                angles.sin().expect("sin"),
            ],
            &[true, false, false],
            |x| fused::rope(&x[0], &x[1], &x[2]).expect("rope"),
        );
        // tokens first in, heads first out (the model's q and k), and the backward back
        parity(
            &format!("rope_heads {b}x{t}x{h}x{d}"),
            &gpu,
            &[
                random(8, &[b, t, h, d], 1.0),
                angles.cos().expect("cos"),
                angles.sin().expect("sin"),
            ],
            &[true, false, false],
            |x| fused::rope_heads(&x[0], &x[1], &x[2]).expect("rope_heads"),
        );
    }
    for (b, kv, rep, t, s) in [
        (1usize, 1usize, 1usize, 1usize, 1usize),
        (2, 2, 3, 9, 13),
        (1, 1, 2, 33, 300),
    ] {
        // a causal mask with left padding on the first sequence
        let mut bias = vec![0f32; b * t * s];
        for bi in 0..b {
            for ti in 0..t {
                for si in 0..s {
                    if si > ti + (s - t) || (bi == 0 && si < 2.min(s - 1)) {
                        bias[(bi * t + ti) * s + si] = -1e9;
                    }
                }
            }
        }
        let bias = Tensor::from_vec(bias, (b, 1, t, s), &Device::Cpu).expect("bias");
        parity(
            &format!("attention softmax {b}x{kv}x{rep}x{t}x{s}"),
            &gpu,
            &[random(7, &[b, kv, rep, t, s], 3.0), bias],
            &[true, false],
            |x| fused::attention_probs(&x[0], &x[1], 0.125).expect("softmax"),
        );
    }
}

#[test]
fn token_log_probs_match_the_cpu_twin_in_value_and_gradient() {
    let Some(gpu) = gpu("token_log_probs_match_the_cpu_twin_in_value_and_gradient") else {
        return;
    };
    for (rows, v) in [(1usize, 3usize), (19, 1000), (4, 151_936)] {
        let mut rng = acpo::rng::SplitMix64::new(rows as u64);
        let targets: Vec<u32> = (0..rows)
            .map(|_| (rng.next_u64() % v as u64) as u32)
            .collect();
        let logits = random(8, &[rows, v], 4.0);
        let lp = |z: &Tensor, device: &Device| {
            let t = Tensor::new(targets.as_slice(), device).expect("t");
            let z = Var::from_tensor(&z.to_device(device).expect("to")).expect("var");
            let lp = acpo::algo::token::log_probs(z.as_tensor(), &t, 0.7).expect("lp");
            let grads = lp.sum_all().and_then(|l| l.backward()).expect("backward");
            (lp, grads.get(z.as_tensor()).expect("dz").clone())
        };
        let (a, da) = lp(&logits, &Device::Cpu);
        let (b, db) = lp(&logits, &gpu);
        assert!(
            rel_err(&b, &a) <= 1e-5,
            "log-probs {rows}x{v}: {:.2e}",
            rel_err(&b, &a)
        );
        assert!(
            rel_err(&db, &da) <= 1e-5,
            "dz {rows}x{v}: {:.2e}",
            rel_err(&db, &da)
        );
    }
}

/// The whole-model AdamW step on CUDA (kernels/adamw.cu) does the CPU twin's f32 operations in
/// order: the same bits, f32 and bf16 parameters alike, when the gradients are not clipped.
/// With clipping, the clip coefficient comes from the global gradient norm, whose sum runs in
/// another order on the GPU (float64 over chunks) than on the CPU (f32 per tensor, then
/// float64; seen on the first H100, 2026-11-23), so there the update agrees to f32 rounding, and
/// the norms to 1e-6.
#[test]
fn adamw_on_cuda_is_the_cpu_update_bit_for_bit() {
    let Some(gpu) = gpu("adamw_on_cuda_is_the_cpu_update_bit_for_bit") else {
        return;
    };
    for grad_clip in [1e9, 0.5] {
        let ((cpu, cpu_norms), (cuda, cuda_norms)) = (
            adamw_steps(&Device::Cpu, grad_clip),
            adamw_steps(&gpu, grad_clip),
        );
        for (a, b) in cpu_norms.iter().zip(&cuda_norms) {
            assert!((a - b).abs() <= 1e-6 * a, "‖g‖ {b} on CUDA, {a} on the CPU");
        }
        for (a, b) in cpu.iter().zip(&cuda) {
            if grad_clip > 1e6 {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "the unclipped CUDA update differs from the CPU's");
            } else {
                let t = |v: &Vec<f32>| Tensor::new(v.as_slice(), &Device::Cpu).expect("t");
                let e = rel_err(&t(b), &t(a));
                assert!(e < 1e-6, "the clipped CUDA update is off by {e:.2e}");
            }
        }
    }
}

fn adamw_spec(grad_clip: f64) -> acpo::optim::OptimSpec {
    acpo::optim::OptimSpec {
        lr: 1e-3,
        lr_schedule: acpo::optim::LrSchedule::Constant,
        warmup_steps: 0,
        grad_clip,
        weight_decay: 0.01,
        betas: [0.9, 0.999],
        eps: 1e-8,
    }
}

/// Three AdamW steps on three parameters (one of them bf16, one without a gradient on the
/// second step, one longer than a chunk of the kernel) on `device`; the parameters after them
/// (as f32) and each step's gradient norm.
fn adamw_steps(device: &Device, grad_clip: f64) -> (Vec<Vec<f32>>, Vec<f64>) {
    use acpo::model::Params;
    use acpo::optim::{AdamW, Gradients};
    let shapes: [(&str, &[usize], DType); 3] = [
        ("a", &[257, 3], DType::F32),
        ("b", &[100_003], DType::F32),
        ("c", &[33, 65], DType::BF16),
    ];
    let mut vars = std::collections::BTreeMap::new();
    for (i, (name, shape, dtype)) in shapes.iter().enumerate() {
        let t = random(10 + i as u64, shape, 1.0)
            .to_dtype(*dtype)
            .and_then(|t| t.to_device(device))
            .expect("to");
        vars.insert(name.to_string(), Var::from_tensor(&t).expect("v"));
    }
    let params = Params::new(vars);
    let mut opt = AdamW::new(&params, &adamw_spec(grad_clip)).expect("adamw");
    let mut norms = Vec::new();
    for step in 0..3u64 {
        let mut g = std::collections::BTreeMap::new();
        for (i, (name, shape, _)) in shapes.iter().enumerate() {
            if *name == "b" && step == 1 {
                continue; // a missing gradient on step 1
            }
            let t = random(20 + 10 * step + i as u64, shape, 1.0);
            g.insert(name.to_string(), t.to_device(device).expect("g"));
        }
        let report = opt.step(&Gradients::from_map(g)).expect("step");
        assert!(report.applied && report.params_finite);
        norms.push(report.grad_norm);
    }
    let values = params
        .vars()
        .map(|(_, v)| {
            v.flatten_all()
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.to_device(&Device::Cpu))
                .and_then(|t| t.to_vec1::<f32>())
                .expect("host")
        })
        .collect();
    (values, norms)
}

/// The CUDA step updates the moments and the parameters where they are: the device holds no
/// more during a step than before it but the step's tables (40 bytes a tensor, 8 a chunk of
/// 16,384 elements), less than a byte a parameter; the per-tensor path held 20 bytes a
/// parameter of the largest tensor besides. A NaN gradient skips the step and writes nothing; an update that overflows
/// says so.
#[test]
fn the_cuda_adamw_step_works_in_place_and_reports_non_finite_values() {
    let Some(gpu) = gpu("the_cuda_adamw_step_works_in_place_and_reports_non_finite_values") else {
        return;
    };
    use acpo::model::Params;
    use acpo::optim::{AdamW, Gradients};
    let n = 4 << 20;
    let mut vars = std::collections::BTreeMap::new();
    let p = random(1, &[n], 1.0).to_device(&gpu).expect("to");
    vars.insert("w".to_string(), Var::from_tensor(&p).expect("v"));
    let params = Params::new(vars);
    let host = |params: &Params| -> Vec<u32> {
        let (_, v) = params.vars().next().expect("w");
        v.to_device(&Device::Cpu)
            .and_then(|t| t.to_vec1::<f32>())
            .expect("host")
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let mut opt = AdamW::new(&params, &adamw_spec(1.0)).expect("adamw");
    let grads = |x: f32| {
        let g = (random(2, &[n], 1.0) * x as f64)
            .and_then(|g| g.to_device(&gpu))
            .expect("g");
        Gradients::from_map(std::collections::BTreeMap::from([("w".to_string(), g)]))
    };
    let g = grads(1.0);
    opt.step(&g).expect("a first step, loading the kernels");
    let meter = acpo::device::PeakMeter::new(&gpu);
    let before = meter.current().expect("the pool's use");
    meter.reset();
    let report = opt.step(&g).expect("step");
    let grew = meter.peak().expect("peak").saturating_sub(before);
    assert!(report.applied && report.params_finite);
    assert!(
        grew < n as u64,
        "a step of {n} parameters took {grew} bytes more than the state (at most a byte a parameter)"
    );
    let was = host(&params);
    let mut nan = grads(1.0);
    nan.accumulate(grads(f32::NAN)).expect("nan");
    let skipped = opt.step(&nan).expect("step");
    assert!(!skipped.applied && skipped.grad_norm.is_nan() && skipped.params_finite);
    assert_eq!(host(&params), was, "a skipped step wrote the parameters");
    assert_eq!(opt.steps_taken(), 2);
    let mut huge = AdamW::new(
        &params,
        &acpo::optim::OptimSpec {
            lr: 1e38,
            ..adamw_spec(1.0)
        },
    )
    .expect("adamw");
    let r = huge.step(&g).expect("step");
    assert!(r.applied && !r.params_finite, "an overflow went unreported");
}

/// Every weight gets a gradient on CUDA, in f32 and in bf16 mixed precision.
#[test]
fn every_weight_gets_a_gradient_on_cuda() {
    let Some(gpu) = gpu("every_weight_gets_a_gradient_on_cuda") else {
        return;
    };
    use acpo::model::{qwen::Qwen, Params, QwenConfig};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3");
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    for compute in [DType::F32, DType::BF16] {
        let params = Params::load_dir(&dir, DType::F32, &gpu)
            .expect("weights")
            .with_compute(compute);
        let model = Qwen::new(&cfg, &params, false).expect("model");
        let (b, t) = (2usize, 8usize);
        let ids: Vec<u32> = (0..(b * t) as u32).map(|i| (i * 37 + 5) % 128).collect();
        let rows: Vec<Vec<u32>> = ids.chunks(t).map(<[u32]>::to_vec).collect();
        let h = super::model::forward_full(&model, &rows);
        let targets = Tensor::from_vec(ids, (b, t), &gpu).expect("targets");
        let (lp, _) = model
            .token_log_probs(&h, &targets, 1.0, 3, false)
            .expect("lp");
        let grads = lp.mean_all().and_then(|l| l.backward()).expect("backward");
        for (name, var) in params.vars() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{compute:?} {name}: no gradient"));
            let s = g
                .abs()
                .and_then(|g| g.sum_all())
                .and_then(|g| g.to_dtype(DType::F32))
                .and_then(|g| g.to_scalar::<f32>())
                .expect("sum");
            assert!(s.is_finite() && s > 0.0, "{compute:?} {name}: gradient {s}");
        }
    }
}

/// The four algorithms train on CUDA (f32 and bf16 mixed precision), and a run interrupted at
/// its checkpoint resumes to the same metrics and weights as an uninterrupted CUDA run.
#[test]
fn the_four_algorithms_train_on_cuda_and_resume_exactly() {
    let Some(_) = gpu("the_four_algorithms_train_on_cuda_and_resume_exactly") else {
        return;
    };
    use super::train::{manifest, metrics, options, train, without_timing, workspace};
    let ws = workspace();
    for name in ["smoke-ppo", "smoke-ppo-ac", "smoke-grpo", "smoke-grpo-ac"] {
        for dtype in ["f32", "bf16"] {
            let edits = [
                ("device: cpu", "device: cuda"),
                (
                    "dtype: f32",
                    if dtype == "f32" {
                        "dtype: f32"
                    } else {
                        "dtype: bf16"
                    },
                ),
                ("total_steps: 3", "total_steps: 4"),
                ("eval_every: 2", "eval_every: 4"),
            ];
            let (exp, text) = manifest(ws.path(), name, &edits);
            let out = ws.path().join(format!("{name}-{dtype}"));
            let straight =
                train(&exp, &text, &options(&out.join("a"), false, None)).expect("4 steps");
            train(&exp, &text, &options(&out.join("b"), false, Some(2))).expect("2 steps");
            let resumed = train(&exp, &text, &options(&out.join("b"), true, None)).expect("resume");
            let m = metrics(&straight);
            assert_eq!(m.len(), 4, "{name} {dtype}");
            assert!(
                m.iter().all(|s| s.values().all(|v| v.is_finite())),
                "{name} {dtype}: {m:?}"
            );
            assert_eq!(
                without_timing(m),
                without_timing(metrics(&resumed)),
                "{name} {dtype}: resumed metrics differ"
            );
            let policy = |d: &std::path::Path| {
                std::fs::read(d.join("checkpoints/step_000004/policy/model.safetensors"))
                    .expect("policy")
            };
            assert!(
                policy(&straight) == policy(&resumed),
                "{name} {dtype}: weights differ"
            );
        }
    }
}

/// The GPU sampler (kernels/sample.cu) draws what the CPU sampler draws from the same logits
/// (f32, and bf16 read as they are) with the same keys: the same tokens, and log-probabilities
/// to f32 rounding, each row from its own sample's stream: the full distribution, and top-p,
/// top-k, both and greedy (the truncated kernel), on random logits and on logits rounded to
/// quarters, which tie at every cut.
#[test]
fn the_gpu_sampler_draws_the_cpu_samplers_tokens() {
    let Some(gpu) = gpu("the_gpu_sampler_draws_the_cpu_samplers_tokens") else {
        return;
    };
    use acpo::rollout::{sample_rows, SamplingParams};
    // (rows, V, T, top-p, top-k, logits rounded to quarters)
    let cases = [
        (5usize, 7usize, 1.0f64, 1.0f64, None, false),
        (37, 1000, 0.7, 1.0, None, false),
        (8, 151_936, 1.0, 1.0, None, false),
        (37, 1000, 1.0, 0.9, None, false),
        (37, 1000, 1.0, 0.8, None, true),
        (37, 1000, 1.0, 1.0, Some(20usize), true),
        (37, 1000, 0.0, 1.0, None, true),
        (16, 151_936, 0.0, 1.0, None, false),
        (8, 151_936, 0.7, 0.95, Some(50), false),
        (8, 151_936, 1.0, 0.9, None, true),
    ];
    // f32 logits, and bf16 ones as a GPU model's lm_head leaves them (the host then draws from
    // their exact f32 values)
    let dtypes = [DType::F32, DType::BF16];
    for ((rows, v, temperature, top_p, top_k, coarse), dtype) in
        cases.into_iter().flat_map(|c| dtypes.map(|d| (c, d)))
    {
        let mut logits = random(40 + rows as u64, &[rows, v], 3.0);
        if coarse {
            logits = ((logits * 4.0).expect("scale").round().expect("round") / 4.0).expect("scale");
        }
        let logits = logits.to_dtype(dtype).expect("dtype");
        let params = SamplingParams {
            temperature,
            top_p,
            top_k,
            max_new_tokens: 1,
        };
        // row r draws from sample active[r]'s stream, not from the r-th
        let active: Vec<usize> = (0..rows).rev().collect();
        let draw = |device: &Device| {
            let mut rngs: Vec<acpo::rng::SplitMix64> = (0..rows as u64)
                .map(|i| acpo::rng::SplitMix64::from_key(&[7, i, 0, 0]))
                .collect();
            let z = logits.to_device(device).expect("to");
            // three tokens in a row from each sample's stream
            (0..3)
                .flat_map(|_| sample_rows(&z, &active, &mut rngs, &params).expect("sample"))
                .collect::<Vec<_>>()
        };
        let (cpu, cuda) = (draw(&Device::Cpu), draw(&gpu));
        for ((ta, la), (tb, lb)) in cpu.iter().zip(&cuda) {
            assert_eq!(
                ta, tb,
                "{rows}x{v} {dtype:?} T={temperature} top-p {top_p} top-k {top_k:?} (ties: \
                 {coarse}): tokens differ"
            );
            assert!(
                (la - lb).abs() <= 1e-5 * la.abs().max(1.0),
                "log-prob {la} vs {lb}"
            );
        }
    }
}

/// acpo on CUDA against HF transformers (tests/fixtures/model_reference.json, made by
/// tools/oracles/ref_model.py): the logits of a random Qwen3 and a sharded random Qwen2 in f32 and in
/// bf16, and in f32 the greedy continuation token for token, through the KV cache.
#[test]
fn cuda_logits_and_greedy_tokens_match_transformers() {
    let Some(gpu) = gpu("cuda_logits_and_greedy_tokens_match_transformers") else {
        return;
    };
    use super::model::{forward_full, ids_of, reference, reference_logits};
    use acpo::model::{qwen::Qwen, Params, Precision, QwenConfig};
    use acpo::rollout::{self, SampleRequest, SamplingParams};
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let r = reference();
    let input = ids_of(&r["input_ids"]);
    let (b, t) = (input.len(), input[0].len());
    for name in ["tiny-qwen3", "tiny-qwen2"] {
        let dir = fixtures.join(name);
        let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
        let want = Tensor::from_vec(
            reference_logits(&r, name),
            (b, t, cfg.vocab_size),
            &Device::Cpu,
        )
        .expect("want");
        for dtype in [
            acpo::model::spec::DType::F32,
            acpo::model::spec::DType::Bf16,
        ] {
            let p = Precision::inference(dtype);
            let params = Params::load_dir(&dir, p.master, &gpu)
                .expect("weights")
                .with_compute(p.compute);
            let model = Qwen::new(&cfg, &params, true).expect("model");
            let h = forward_full(&model, &input);
            let logits = model.logits(&h).expect("logits");
            let e = rel_err(&logits, &want);
            // bf16: as close to transformers as the same model in bf16 on the CPU, within half
            // again (their roundings differ; the CPU's error is ~2e-2 on these random models).
            let tol = if p.compute == DType::F32 {
                1e-5
            } else {
                1.5 * super::model::bf16_logits_rel_err(name, &Device::Cpu)
            };
            eprintln!("{name} {dtype:?}: logits relative error {e:.2e} (at most {tol:.2e})");
            assert!(e <= tol, "{name} {dtype:?}: logits off by {e:.2e}");
            if p.compute == DType::F32 {
                let prompt = ids_of(&serde_json::Value::Array(vec![r["models"][name]
                    ["greedy_prompt"]
                    .clone()]))
                .remove(0);
                let greedy = ids_of(&serde_json::Value::Array(vec![
                    r["models"][name]["greedy"].clone()
                ]))
                .remove(0);
                let params = SamplingParams {
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: None,
                    max_new_tokens: greedy.len(),
                };
                let out =
                    rollout::generate(&model, &[prompt], &[[0; 4]], &SampleRequest::new(params))
                        .expect("generate");
                assert_eq!(out[0].tokens, greedy, "{name}: greedy continuation on CUDA");
            }
        }
    }
}

/// Flash attention against its CPU twin, forward and backward: left padding with query rows that
/// see no key, a decode step after a cache, tiles cut mid-way, grouped-query heads, head dims 8
/// to 128. In f32 and at the other head dims the row kernels run (kernels/flash_attn.cu); in
/// bf16 at head dim 64 and 128 with more than one query position the tensor-core forward and
/// backward (kernels/flash_mma.cu: padding over whole key blocks, blocks with blind rows,
/// several tiles); one query position runs a decode kernel, the pipelined one at head dim 64 and
/// 128 (kernels/flash_decode.cu: several chunks, up to 7 query heads per KV head, and a row that
/// sees no key), the split-K one at head dim 32, whose statistics the backward reads. Both
/// backwards of the tensor-core kernels (`FlashBackward`: the pair, and the one in 5 products).
#[test]
fn flash_attention_forward_and_backward_match_the_cpu_twin() {
    let Some(gpu) = gpu("flash_attention_forward_and_backward_match_the_cpu_twin") else {
        return;
    };
    use acpo::fused;
    // (b, h, kv, t, past, d, pad)
    for (seed, [b, h, kv, t, past, d, pad]) in [
        (1u64, [2usize, 4, 2, 7, 0, 24, 3]),
        (2, [1, 3, 1, 1, 700, 64, 5]),
        (3, [2, 16, 8, 300, 0, 128, 40]),
        (4, [3, 6, 2, 65, 31, 8, 1]),
        (5, [2, 4, 1, 129, 70, 64, 100]),
        (6, [3, 14, 2, 1, 1300, 128, 900]),
        (7, [2, 2, 1, 1, 40, 32, 41]),
        (8, [2, 2, 1, 200, 0, 64, 130]),
        (9, [2, 4, 2, 257, 0, 128, 0]),
    ] {
        let s = past + t;
        let valid: Vec<u8> = (0..b * s)
            .map(|i| u8::from(!(i / s == 0 && i % s < pad)))
            .collect();
        let valid = Tensor::from_vec(valid, (b, s), &Device::Cpu).expect("valid");
        let scale = 1.0 / (d as f64).sqrt();
        for backward in [
            fused::FlashBackward::Pair,
            fused::FlashBackward::FiveProducts,
        ] {
            parity(
                &format!(
                    "flash attention {:?} {backward:?}",
                    [b, h, kv, t, past, d, pad]
                ),
                &gpu,
                &[
                    random(seed, &[b, h, t, d], 1.0),
                    random(seed + 10, &[b, kv, s, d], 1.0),
                    random(seed + 20, &[b, kv, s, d], 1.0),
                ],
                &[true, true, true],
                |x| {
                    let valid = valid.to_device(x[0].device()).expect("valid");
                    fused::flash_attention(&x[0], &x[1], &x[2], &valid, past, scale, backward)
                        .expect("flash")
                },
            );
        }
    }
}

/// The backward in 5 products (`FlashBackward::FiveProducts`, kernels/flash_mma.cu
/// `flash_dkdvq_*`) against the pair, on the tensor-core kernels (bf16, head dims 64 and 128):
/// dK and dV the pair's bits (the same kernel computes them in the same order), dQ within bf16
/// rounding of the pair's, and dQ's bits the same from one run to the next, the determinism its
/// ordered adds are for (the emulator checks every schedule it draws; this is the hardware's).
/// Shapes with left padding, a partial last query tile, several key blocks per head and 2 query
/// heads per KV head, and the paper's 16 over 8 at 1,100 positions, so that 144 blocks (more
/// than an H100 has SMs) wait on one another.
#[test]
fn flash_backward_in_five_products_gives_the_pairs_gradients_and_repeats_its_bits() {
    let Some(gpu) =
        gpu("flash_backward_in_five_products_gives_the_pairs_gradients_and_repeats_its_bits")
    else {
        return;
    };
    use acpo::fused::{self, FlashBackward};
    // (b, h, kv, t, d, pad)
    for (seed, [b, h, kv, t, d, pad]) in [
        (1u64, [2usize, 4, 2, 200, 64, 37]),
        (2, [3, 2, 1, 129, 128, 0]),
        (3, [2, 16, 8, 1100, 128, 300]),
    ] {
        let valid: Vec<u8> = (0..b * t)
            .map(|i| u8::from(!(i / t == 0 && i % t < pad)))
            .collect();
        let valid = Tensor::from_vec(valid, (b, t), &gpu).expect("valid");
        let scale = 1.0 / (d as f64).sqrt();
        let on_gpu = |t: Tensor| {
            Var::from_tensor(
                &t.to_dtype(DType::BF16)
                    .and_then(|t| t.to_device(&gpu))
                    .expect("to"),
            )
            .expect("var")
        };
        let (q, k, v) = (
            on_gpu(random(seed, &[b, h, t, d], 1.0)),
            on_gpu(random(seed + 10, &[b, kv, t, d], 1.0)),
            on_gpu(random(seed + 20, &[b, kv, t, d], 1.0)),
        );
        let dout = random(seed + 30, &[b, h, t, d], 1.0)
            .to_dtype(DType::BF16)
            .and_then(|t| t.to_device(&gpu))
            .expect("dout");
        let grads = |backward: FlashBackward| -> [Tensor; 3] {
            let out =
                fused::flash_attention(&q, &k, &v, &valid, 0, scale, backward).expect("flash");
            let g = fused::backward_seed(&out, &dout)
                .and_then(|seed| seed.backward())
                .expect("backward");
            [&q, &k, &v].map(|x| g.get(x.as_tensor()).expect("a gradient").clone())
        };
        // bf16 widens to f32 exactly: equal f32 bits are equal bf16 bits
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .expect("host")
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        let what = format!("{:?}", [b, h, kv, t, d, pad]);
        let [dq7, dk7, dv7] = grads(FlashBackward::Pair);
        let [dq5, dk5, dv5] = grads(FlashBackward::FiveProducts);
        assert!(
            bits(&dk5) == bits(&dk7),
            "{what}: dK differs from the pair's"
        );
        assert!(
            bits(&dv5) == bits(&dv7),
            "{what}: dV differs from the pair's"
        );
        let e = rel_err(&dq5, &dq7);
        assert!(
            e <= tolerance(DType::BF16),
            "{what}: dQ off the pair's by {e:.2e}"
        );
        // the fused kernel really ran: its dQ sums key blocks' partial sums, the pair's dQ
        // kernel one key tile after another, so over 4.5 M elements some roundings differ
        if t >= 1000 {
            assert!(
                bits(&dq5) != bits(&dq7),
                "{what}: dQ is the pair's bit for bit"
            );
        }
        for run in 1..=3 {
            let [dq, _, _] = grads(FlashBackward::FiveProducts);
            assert!(
                bits(&dq) == bits(&dq5),
                "{what}: dQ's bits changed on run {run}"
            );
        }
    }
}

/// The decode kernel reads a KV cache's buffer in place (room beyond the filled columns) and
/// groups each row's keys from its first valid one, so a row's attention is bit for bit what it
/// gets alone, unpadded, in a buffer of its own length (issue #20: a completion does not depend
/// on its batch).
#[test]
fn flash_decode_rows_do_not_depend_on_their_batch() {
    let Some(gpu) = gpu("flash_decode_rows_do_not_depend_on_their_batch") else {
        return;
    };
    use acpo::fused;
    let (h, kv, d, cap, s) = (16usize, 8usize, 128usize, 1600usize, 1500usize);
    let lens = [1500usize, 700, 1];
    let b = lens.len();
    let scale = 1.0 / (d as f64).sqrt();
    let valid: Vec<u8> = lens
        .iter()
        .flat_map(|&n| (0..s).map(move |j| u8::from(j >= s - n)))
        .collect();
    for dtype in [DType::F32, DType::BF16] {
        let on_gpu = |t: Tensor| {
            t.to_dtype(dtype)
                .and_then(|t| t.to_device(&gpu))
                .expect("to")
        };
        let q = on_gpu(random(1, &[b, h, 1, d], 1.0));
        let kb = on_gpu(random(2, &[b, kv, cap, d], 1.0));
        let vb = on_gpu(random(3, &[b, kv, cap, d], 1.0));
        let valid = Tensor::from_vec(valid.clone(), (b, s), &gpu).expect("valid");
        let pair = fused::FlashBackward::Pair;
        let batch =
            fused::flash_attention(&q, &kb, &vb, &valid, s - 1, scale, pair).expect("batch");
        for (r, &n) in lens.iter().enumerate() {
            let own = |t: &Tensor| {
                t.narrow(0, r, 1)
                    .and_then(|t| t.narrow(2, s - n, n))
                    .and_then(|t| t.contiguous())
                    .expect("row")
            };
            let ones = Tensor::ones((1, n), DType::U8, &gpu).expect("ones");
            let q_r = q.narrow(0, r, 1).expect("q");
            let alone =
                fused::flash_attention(&q_r, &own(&kb), &own(&vb), &ones, n - 1, scale, pair)
                    .expect("alone");
            let bits = |t: &Tensor| -> Vec<f32> {
                t.to_dtype(DType::F32)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1())
                    .expect("host")
            };
            assert!(
                bits(&batch.narrow(0, r, 1).expect("row")) == bits(&alone),
                "{dtype:?}: row {r} ({n} keys) differs from its solo attention"
            );
        }
    }
}

/// The vocabulary-chunked log-probabilities and entropy on CUDA (cuBLAS chunks) against the
/// CPU, values and gradients of the hidden states and the lm_head.
#[test]
fn chunked_vocabulary_log_probs_match_the_cpu() {
    let Some(gpu) = gpu("chunked_vocabulary_log_probs_match_the_cpu") else {
        return;
    };
    let (n, hd, v) = (37usize, 64usize, 5000usize);
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 131 + 7) % v as u32).collect();
    let targets = Tensor::from_vec(targets, n, &Device::Cpu).expect("targets");
    parity(
        "vocabulary chunks",
        &gpu,
        &[random(1, &[n, hd], 1.0), random(2, &[v, hd], 0.3)],
        &[true, true],
        |x| {
            let t = targets.to_device(x[0].device()).expect("targets");
            let (lp, ent) =
                acpo::fused::vocab_log_probs(&x[0], &x[1], &t, 0.9, 1024).expect("vocab");
            Tensor::stack(&[lp, ent], 1).expect("stack")
        },
    );
}

/// Gradient checkpointing on CUDA, with flash attention and the chunked vocabulary (the GPU's
/// default kernels), gives the plain backward's gradients bit for bit in f32.
#[test]
fn gradient_checkpointing_on_cuda_is_bit_identical_in_f32() {
    let Some(gpu) = gpu("gradient_checkpointing_on_cuda_is_bit_identical_in_f32") else {
        return;
    };
    use acpo::model::{qwen::Qwen, Params, QwenConfig};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3");
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    let params = Params::load_dir(&dir, DType::F32, &gpu).expect("weights");
    let model = Qwen::new(&cfg, &params, false).expect("model");
    assert!(model.kernels().flash_attention && model.kernels().vocab_chunk.is_some());
    let (b, t) = (2usize, 40usize);
    let ids: Vec<u32> = (0..(b * t) as u32).map(|i| (i * 37 + 5) % 128).collect();
    let ids = Tensor::from_vec(ids, (b, t), &gpu).expect("ids");
    let pos = Tensor::arange(0u32, t as u32, &gpu)
        .and_then(|p| p.unsqueeze(0))
        .and_then(|p| p.repeat((b, 1)))
        .expect("pos");
    let valid = Tensor::ones((b, t), DType::U8, &gpu).expect("valid");
    let targets = ids.narrow(1, 1, t - 1).expect("targets");
    let loss_of = |m: &Qwen, h: &Tensor| -> acpo::model::Result<Tensor> {
        let (lp, ent) = m.token_log_probs(&h.narrow(1, 0, t - 1)?, &targets, 1.0, 16, true)?;
        let ent = ent.expect("entropy");
        Ok((ent.mean_all()? * 0.01 - lp.mean_all()?)?)
    };
    let (hidden, _) = model
        .forward_hidden(&ids, &pos, &valid, None)
        .expect("forward");
    let plain = loss_of(&model, &hidden)
        .and_then(|l| Ok(l.backward()?))
        .expect("plain");
    let mut ckpt = candle_core::backprop::GradStore::default();
    model
        .checkpointed_backward(
            &ids,
            &pos,
            &valid,
            |m, h| Ok::<_, acpo::model::ModelError>((loss_of(m, h)?, ())),
            |layer| Ok(ckpt.extend(layer)?),
        )
        .expect("checkpointed");
    for (name, var) in params.vars() {
        let host = |s: &candle_core::backprop::GradStore| {
            s.get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no gradient"))
                .flatten_all()
                .and_then(|g| g.to_vec1::<f32>())
                .expect("to host")
        };
        assert!(
            host(&plain) == host(&ckpt),
            "{name}: checkpointed gradient differs"
        );
    }
}

/// A batch a checkpointed step trains on: `b` sequences of `t` tokens (ids from a fixed
/// pattern of a 128-token vocabulary), the first `pad` positions of the first one padding, the
/// next token the target.
struct StepBatch {
    ids: Tensor,
    pos: Tensor,
    valid: Tensor,
    targets: Tensor,
}

impl StepBatch {
    fn new(gpu: &Device, b: usize, t: usize, pad: usize) -> StepBatch {
        let ids: Vec<u32> = (0..(b * t) as u32).map(|i| (i * 37 + 5) % 128).collect();
        let ids = Tensor::from_vec(ids, (b, t), gpu).expect("ids");
        let pos = Tensor::arange(0u32, t as u32, gpu)
            .and_then(|p| p.unsqueeze(0))
            .and_then(|p| p.repeat((b, 1)))
            .expect("pos");
        let valid: Vec<u8> = (0..b * t).map(|i| u8::from(i >= pad)).collect();
        let valid = Tensor::from_vec(valid, (b, t), gpu).expect("valid");
        let targets = ids.narrow(1, 1, t - 1).expect("targets");
        StepBatch {
            ids,
            pos,
            valid,
            targets,
        }
    }

    /// `var`'s gradient in `store`, in f32 on the host.
    fn host_grad(store: &candle_core::backprop::GradStore, var: &Var, name: &str) -> Vec<f32> {
        store
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient"))
            .to_dtype(DType::F32)
            .and_then(|g| g.flatten_all())
            .and_then(|g| g.to_vec1::<f32>())
            .expect("to host")
    }

    /// Every weight's gradient of a checkpointed step of `model` on the batch: the loss is the
    /// targets' mean log-probability negated, less 0.01 × the mean entropy when `entropy`
    /// (vocabulary chunks of 16).
    fn checkpointed_grads(
        &self,
        model: &acpo::model::qwen::Qwen,
        entropy: bool,
    ) -> candle_core::backprop::GradStore {
        let t = self.ids.dim(1).expect("t");
        let mut store = candle_core::backprop::GradStore::default();
        model
            .checkpointed_backward(
                &self.ids,
                &self.pos,
                &self.valid,
                |m, h| -> acpo::model::Result<(Tensor, ())> {
                    let h = h.narrow(1, 0, t - 1)?;
                    let (lp, ent) = m.token_log_probs(&h, &self.targets, 1.0, 16, entropy)?;
                    let loss = match ent {
                        Some(ent) => (ent.mean_all()? * 0.01 - lp.mean_all()?)?,
                        None => (lp.mean_all()? * -1.0)?,
                    };
                    Ok((loss, ()))
                },
                |layer| Ok(store.extend(layer)?),
            )
            .expect("checkpointed");
        store
    }
}

/// Each decoder layer's backward written out by hand (`Kernels::layer_by_hand`, issue #59 item
/// 2) on CUDA, with the GPU's kernels (flash attention, the chunked vocabulary), against
/// autograd over the composed layer: the same gradients to f32 round-off in f32; in bf16 (f32
/// masters) as close to the f32 step's as autograd's are (`model::bf16_as_close_as`: the two
/// order their roundings differently, and on the CPU differ from each other by more than either
/// differs from f32).
#[test]
fn the_layer_backward_by_hand_on_cuda_gives_autograds_gradients() {
    let Some(gpu) = gpu("the_layer_backward_by_hand_on_cuda_gives_autograds_gradients") else {
        return;
    };
    use acpo::model::qwen::{Kernels, Qwen};
    use acpo::model::{Params, QwenConfig};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3");
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    let batch = StepBatch::new(&gpu, 2, 40, 0);
    let masters = Params::load_dir(&dir, DType::F32, &gpu).expect("weights");
    let grads = |by_hand: bool, compute: DType| {
        let params = masters.clone().with_compute(compute);
        let model = Qwen::new(&cfg, &params, false).expect("model");
        let model = model.clone().with_kernels(Kernels {
            layer_by_hand: by_hand,
            flash_backward: acpo::fused::FlashBackward::Pair,
            ..model.kernels()
        });
        assert!(model.kernels().flash_attention);
        let store = batch.checkpointed_grads(&model, true);
        masters
            .vars()
            .map(|(name, var)| StepBatch::host_grad(&store, var, name))
            .collect::<Vec<_>>()
    };
    let truth = grads(false, DType::F32);
    let f32_by_hand = grads(true, DType::F32);
    let (autograd, by_hand) = (grads(false, DType::BF16), grads(true, DType::BF16));
    for (i, (name, _)) in masters.vars().enumerate() {
        let d = super::model::scaled_max_diff(&f32_by_hand[i], &truth[i], 1e-12);
        assert!(d < 1e-4, "F32 {name}: differs by {d} of its largest");
        if let Err(e) = super::model::bf16_as_close_as(&by_hand[i], &autograd[i], &truth[i]) {
            panic!("BF16 {name}: by hand {e}");
        }
    }
}

/// The model's step with the attention's backward in 5 products (`Kernels::flash_backward`,
/// issue #59 item 3) on CUDA at the Qwen3-1.7B layer's shapes (16 query and 8 key heads of 128,
/// two layers, bf16, where the tensor-core kernels run; a padded row, several query tiles and
/// key blocks): every weight's gradient within bf16's rounding of the pair's, and the same bits
/// from one step to the next (its dQ adds in a fixed order, so the step stays deterministic).
#[test]
fn the_attention_backward_in_five_products_gives_the_steps_gradients_on_cuda() {
    let Some(gpu) =
        gpu("the_attention_backward_in_five_products_gives_the_steps_gradients_on_cuda")
    else {
        return;
    };
    use acpo::fused::FlashBackward;
    use acpo::model::init;
    use acpo::model::qwen::{Kernels, Qwen};
    let cfg = super::model::qwen3_1_7b_layers(512);
    let batch = StepBatch::new(&gpu, 2, 300, 45);
    let params = init::random_params(&cfg, 7, DType::F32, &gpu)
        .expect("weights")
        .with_compute(DType::BF16);
    let grads = |backward: FlashBackward| {
        let model = Qwen::new(&cfg, &params, false).expect("model");
        let model = model.clone().with_kernels(Kernels {
            flash_backward: backward,
            ..model.kernels()
        });
        assert!(model.kernels().flash_attention);
        batch.checkpointed_grads(&model, false)
    };
    let (pair, five, again) = (
        grads(FlashBackward::Pair),
        grads(FlashBackward::FiveProducts),
        grads(FlashBackward::FiveProducts),
    );
    // The same step computed in f32 (the row kernels' pair): the truth both bf16 steps err from.
    let truth = {
        let params = params.clone().with_compute(DType::F32);
        let model = Qwen::new(&cfg, &params, false).expect("model");
        batch.checkpointed_grads(&model, false)
    };
    for (name, var) in params.vars() {
        let host = |s| StepBatch::host_grad(s, var, name);
        let (p, f) = (host(&pair), host(&five));
        if let Err(e) = super::model::bf16_as_close_as(&f, &p, &host(&truth)) {
            panic!("{name}: in 5 products {e} (the pair's)");
        }
        assert!(f == host(&again), "{name}: another step gave other bits");
    }
}

/// The sampling engine on CUDA (flash attention reading the preallocated cache in place,
/// continuous batching): each prompt's completion is its solo completion, whatever the slots.
#[test]
fn continuous_batching_on_cuda_gives_every_prompt_its_solo_completion() {
    let Some(gpu) = gpu("continuous_batching_on_cuda_gives_every_prompt_its_solo_completion")
    else {
        return;
    };
    use acpo::model::{qwen::Qwen, Params, QwenConfig};
    use acpo::rollout::{self, SampleRequest, SamplingParams};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3");
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    let params = Params::load_dir(&dir, DType::F32, &gpu).expect("weights");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompts: Vec<Vec<u32>> = vec![
        vec![5, 17, 99],
        vec![1, 2, 3, 4, 5, 6, 7],
        vec![42],
        vec![9; 12],
        vec![3, 1, 4, 1, 5],
    ];
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [3, 2, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 12,
    };
    let eos: Vec<u32> = (0..13).collect();
    let solo: Vec<_> = (0..prompts.len())
        .map(|i| {
            let r = SampleRequest::new(p).eos(eos.clone());
            rollout::generate(&model, &prompts[i..=i], &keys[i..=i], &r).expect("solo")[0].clone()
        })
        .collect();
    // prompts join in finished rows' places (KvCache::place_row) and by copies of the cache
    let mut in_place = 0;
    for slots in [1, 2, 3, 4, 5] {
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let r = SampleRequest::new(p)
            .eos(eos.clone())
            .max_batch(slots)
            .stats(&stats);
        let batched = rollout::generate(&model, &prompts, &keys, &r).expect("batched");
        in_place += stats.lock().unwrap().joined_in_place;
        for (i, (b, s)) in batched.iter().zip(&solo).enumerate() {
            assert_eq!(
                b.tokens, s.tokens,
                "{slots} slots, prompt {i}: tokens differ"
            );
        }
    }
    assert!(in_place > 0, "no prompt joined in a finished row's place");
    // A call long enough that the cache drops the columns no row reads (KvCache::drop_front)
    let many: Vec<Vec<u32>> = (0..30u32)
        .map(|i| (0..1 + i % 6).map(|j| 20 + (7 * i + j) % 90).collect())
        .collect();
    let keys: Vec<[u64; 4]> = (0..many.len() as u64).map(|i| [5, 1, i, 0]).collect();
    let stats = std::sync::Mutex::new(rollout::GenStats::default());
    let r = SampleRequest::new(p)
        .eos(eos.clone())
        .max_batch(2)
        .stats(&stats);
    let batched = rollout::generate(&model, &many, &keys, &r).expect("batched");
    assert!(
        stats.lock().unwrap().front_drops > 0,
        "no drop in a long call"
    );
    for (i, b) in batched.iter().enumerate() {
        let r = SampleRequest::new(p).eos(eos.clone());
        let solo = rollout::generate(&model, &many[i..=i], &keys[i..=i], &r).expect("solo");
        assert_eq!(
            b.tokens, solo[0].tokens,
            "long call, prompt {i}: tokens differ"
        );
    }
}

/// The fused chain into an FP8 cache (E4M3 bytes, `qk_norm_rope_*_bf16_fp8`) against the composed
/// chain on the GPU over the same bytes (`fp8_e4m3_from_bf16` rounding each new key and value,
/// values past ±448 among them): q's bits, and every byte of both caches, dense and paged.
#[test]
fn the_fused_decode_chain_writes_the_composed_chains_fp8_bytes() {
    let Some(gpu) = gpu("the_fused_decode_chain_writes_the_composed_chains_fp8_bytes") else {
        return;
    };
    use acpo::fused::{self, KvWrite, QkNorms};
    let (b, h, kv, cap, col, d) = (3usize, 16usize, 8usize, 9usize, 4usize, 128usize);
    let bf = |t: &Tensor| {
        t.to_dtype(DType::BF16)
            .and_then(|t| t.to_device(&gpu))
            .expect("to the GPU")
    };
    let (q, k, v) = (
        random(11, &[b, 1, h, d], 2.0),
        random(12, &[b, 1, kv, d], 2.0),
        random(13, &[b, 1, kv, d], 300.0),
    );
    let qkv = bf(&super::fused::packed_qkv(&q, &k, &v));
    let (q, k, v) = (bf(&q), bf(&k), bf(&v));
    let (qw, kw) = (bf(&random(14, &[d], 1.0)), bf(&random(15, &[d], 1.0)));
    let angles = random(16, &[b, 1, 1, d / 2], 3.0);
    let angles = Tensor::cat(&[&angles, &angles], 3).expect("cat");
    let (cos, sin) = (
        bf(&angles.cos().expect("cos")),
        bf(&angles.sin().expect("sin")),
    );
    let norms = Some(QkNorms {
        q: &qw,
        k: &kw,
        eps: 1e-6,
    });
    let pool_rows = b * kv * cap;
    let dest: Vec<u32> = (0..b * kv)
        .map(|i| ((i * 7919 + 3) % pool_rows) as u32)
        .collect();
    let index = Tensor::from_slice(&dest, (b * kv, 1), &gpu)
        .and_then(|t| t.broadcast_as((b * kv, d)))
        .and_then(|t| t.contiguous())
        .expect("index");
    let host = |t: &Tensor| -> Vec<u32> {
        let t = t.flatten_all().expect("flat");
        match t.dtype() {
            DType::U8 => t
                .to_vec1::<u8>()
                .expect("bytes")
                .into_iter()
                .map(u32::from)
                .collect(),
            _ => t
                .to_dtype(DType::F32)
                .and_then(|t| t.to_vec1::<f32>())
                .expect("numbers")
                .into_iter()
                .map(f32::to_bits)
                .collect(),
        }
    };
    for paged in [false, true] {
        let shape: &[usize] = if paged {
            &[pool_rows, d]
        } else {
            &[b, kv, cap, d]
        };
        // the bytes the caches held before: kept wherever the step writes nothing
        let earlier = |seed| fused::to_fp8_bytes(&bf(&random(seed, shape, 100.0))).expect("bytes");
        let (kc, vc) = (earlier(17), earlier(18));
        let (kc_composed, vc_composed) = (kc.copy().expect("copy"), vc.copy().expect("copy"));
        let at = if paged {
            KvWrite::PoolRows(&index)
        } else {
            KvWrite::Column(col)
        };
        let q_fused = fused::qk_norm_rope_cache(&qkv, (h, kv), norms, &cos, &sin, (&kc, &vc), at)
            .expect("fused")
            .expect("the fused kernel takes an FP8 cache under bf16");
        let q_composed = fused::qk_norm_rope_cache_composed(
            &q,
            &k,
            &v,
            norms,
            &cos,
            &sin,
            (&kc_composed, &vc_composed),
            at,
        )
        .expect("composed");
        for (name, got, want) in [
            ("q", &q_fused, &q_composed),
            ("k cache", &kc, &kc_composed),
            ("v cache", &vc, &vc_composed),
        ] {
            assert_eq!(host(got), host(want), "paged {paged}: {name} differs");
        }
    }
}

/// The embedding's backward on CUDA (`kernels/embedding.cu`, issue #59 item 2) is its CPU twin
/// bit for bit, f32 and bf16, with and without the tied lm_head's share: the same positions in
/// the same order, summed in f32; and in f32 the bits of autograd's `index_add` on the GPU. Rows
/// of 2,000 (a block's 256 columns and a part) over a vocabulary whose chunks pass the grid's
/// 65,536 blocks, so that the grid-stride loop wraps; a token at 3 of every 7 positions (several
/// of the kernel's tiles).
#[test]
fn the_embedding_backward_kernel_is_its_cpu_twin_bit_for_bit() {
    let Some(gpu) = gpu("the_embedding_backward_kernel_is_its_cpu_twin_bit_for_bit") else {
        return;
    };
    use acpo::fused::{backward_seed, embedding_backward, TokenRows};
    let (vocab, h) = (8209usize, 2000usize);
    let ids = super::fused::skewed_ids(2, 700, vocab as u32);
    let rows = TokenRows::of(&ids, vocab).expect("rows");
    let on = |t: &Tensor| t.to_device(&gpu).expect("to the GPU");
    let bits = |t: &Tensor| super::fused::bits(&t.to_device(&Device::Cpu).expect("to host"));
    for dtype in [DType::F32, DType::BF16] {
        let g = random(1, &[2, 700, h], 1.0).to_dtype(dtype).expect("dtype");
        let g_lm = random(2, &[vocab, h], 1.0).to_dtype(dtype).expect("dtype");
        for tied in [true, false] {
            let base = tied.then_some(&g_lm);
            let want = embedding_backward(&rows, &g, base).expect("cpu");
            let gbase = base.map(on);
            let got = embedding_backward(&rows, &on(&g), gbase.as_ref()).expect("gpu");
            assert!(got.device().is_cuda());
            assert_eq!(bits(&got), bits(&want), "{dtype:?}, tied {tied}");
        }
    }
    // f32: autograd's route on the GPU (candle's index_add kernel) gives the same bits
    let (g, g_lm) = (
        on(&random(1, &[2, 700, h], 1.0)),
        on(&random(2, &[vocab, h], 1.0)),
    );
    let w = Var::from_tensor(&on(&random(3, &[vocab, h], 1.0))).expect("var");
    let x0 = w
        .as_tensor()
        .index_select(&on(&ids).flatten_all().expect("flat"), 0)
        .and_then(|x| x.reshape((2, 700, h)))
        .expect("lookup");
    let tail = (backward_seed(&x0, &g).expect("seed")
        + backward_seed(w.as_tensor(), &g_lm).expect("seed"))
    .expect("add");
    let want = tail
        .backward()
        .expect("backward")
        .remove(w.as_tensor())
        .expect("W's gradient");
    let got = embedding_backward(&rows, &g, Some(&g_lm)).expect("gpu");
    assert_eq!(bits(&got), bits(&want));
}

/// The pool's stores (kernels/decode_chain.cu, `pool_store_*`: a paged prefill's keys and values,
/// a shared block's copy) write what `scatter_set` writes, bit for bit: in f32, bf16 and an FP8
/// cache's bytes, rows of 16-byte words, of 4-byte words (a head of 12) and of neither (bytes of
/// 6, left to `scatter_set`), from sources that start mid-buffer (a prefill's chunk), through a
/// write index whose rows hold their destination across the head dim; every other pool row
/// kept. The kernel launches exactly where its words fit.
#[test]
fn the_pool_store_writes_what_scatter_set_writes() {
    let Some(gpu) = gpu("the_pool_store_writes_what_scatter_set_writes") else {
        return;
    };
    let (n_pool, n) = (300usize, 200usize);
    // distinct destinations in a scrambled order (7919 is prime)
    let dest: Vec<u32> = (0..n).map(|i| ((i * 7919 + 5) % n_pool) as u32).collect();
    for dtype in [DType::F32, DType::BF16, DType::U8] {
        for (d, skip) in [(128usize, 0usize), (12, 1), (6, 3)] {
            let make = |seed: u64, rows: usize| {
                let x = random(seed, &[rows, d], 40.0);
                let x = if dtype == DType::U8 {
                    x.abs().expect("abs")
                } else {
                    x
                };
                x.to_dtype(dtype).expect("dtype")
            };
            let pool = make(1, n_pool);
            // the source rows start `skip` rows into their buffer, as a prefill's chunk does
            let src = make(2, n + skip).narrow(0, skip, n).expect("narrow");
            let index = Tensor::from_slice(&dest, (n, 1), &Device::Cpu)
                .and_then(|t| t.broadcast_as((n, d)))
                .and_then(|t| t.contiguous())
                .expect("index");
            let want = pool.copy().expect("copy");
            want.scatter_set(&index, &src, 0).expect("scatter_set");
            let on = |t: &Tensor| t.to_device(&gpu).expect("to the GPU");
            let (gpool, gsrc, gindex) = (on(&pool), on(&make(2, n + skip)), on(&index));
            let gsrc = gsrc.narrow(0, skip, n).expect("narrow");
            let before = acpo::fused::pool_store_launches();
            acpo::fused::store_rows(&gpool, &gindex, &gsrc).expect("store");
            let launched = acpo::fused::pool_store_launches() - before;
            // every dtype here is exact in f32
            let bits = |t: &Tensor| {
                super::fused::bits(
                    &t.to_device(&Device::Cpu)
                        .and_then(|t| t.to_dtype(DType::F32))
                        .expect("to host"),
                )
            };
            let (got, want) = (bits(&gpool), bits(&want));
            let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(
                wrong, 0,
                "{dtype:?}, head {d}, skip {skip}: {wrong} numbers differ"
            );
            // a word of 4 bytes needs rows and starts of whole words
            let row = d * dtype.size_in_bytes();
            let fits = row % 4 == 0 && (skip * row) % 4 == 0;
            assert_eq!(
                launched,
                usize::from(fits),
                "{dtype:?}, head {d}, skip {skip}"
            );
        }
    }
}

/// The decode step's fused chain (kernels/decode_chain.cu) against the composed ops it
/// replaces, run on the CPU: q normalised and rotated into heads first, k and v written into
/// the dense cache's column, or into a paged pool's rows through a write index, and nothing
/// else of the cache changed (Qwen3's norms and Qwen2's none); the residual add with the next
/// RMSNorm.
#[test]
fn the_fused_decode_chain_matches_the_composed_ops_on_the_cpu() {
    let Some(gpu) = gpu("the_fused_decode_chain_matches_the_composed_ops_on_the_cpu") else {
        return;
    };
    use acpo::fused::{self, KvWrite};
    fn at(paged: bool, col: usize, index: &Tensor) -> KvWrite<'_> {
        match paged {
            true => KvWrite::PoolRows(index),
            false => KvWrite::Column(col),
        }
    }
    let (b, h, kv, cap, col) = (3usize, 16usize, 8usize, 9usize, 4usize);
    // the paged pool: as many rows as the dense buffers hold, the batch's rows scattered over
    // it (7919 is prime: distinct rows), each index row repeated across the head dim as
    // `PagedKv::write_index` makes it
    let pool_rows = b * kv * cap;
    let dest: Vec<u32> = (0..b * kv)
        .map(|i| ((i * 7919 + 3) % pool_rows) as u32)
        .collect();
    for d in [128usize, 16] {
        let q = random(11, &[b, 1, h, d], 2.0);
        let k = random(12, &[b, 1, kv, d], 2.0);
        let v = random(13, &[b, 1, kv, d], 1.0);
        let (qw, kw) = (random(14, &[d], 1.0), random(15, &[d], 1.0));
        let angles = random(16, &[b, 1, 1, d / 2], 3.0);
        let angles = Tensor::cat(&[&angles, &angles], 3).expect("cat");
        let (cos, sin) = (angles.cos().expect("cos"), angles.sin().expect("sin"));
        let index = Tensor::from_slice(&dest, (b * kv, 1), &Device::Cpu)
            .and_then(|t| t.broadcast_as((b * kv, d)))
            .and_then(|t| t.contiguous())
            .expect("index");
        for paged in [false, true] {
            let shape: &[usize] = if paged {
                &[pool_rows, d]
            } else {
                &[b, kv, cap, d]
            };
            let (kc, vc) = (random(17, shape, 1.0), random(18, shape, 1.0));
            for norm in [true, false] {
                let norms = |qw: &'_ Tensor, kw: &'_ Tensor| norm.then(|| (qw.clone(), kw.clone()));
                let (kc_cpu, vc_cpu) = (kc.copy().expect("copy"), vc.copy().expect("copy"));
                let cpu_norms = norms(&qw, &kw);
                let q_cpu = fused::qk_norm_rope_cache_composed(
                    &q,
                    &k,
                    &v,
                    cpu_norms.as_ref().map(|(a, b)| fused::QkNorms {
                        q: a,
                        k: b,
                        eps: 1e-6,
                    }),
                    &cos,
                    &sin,
                    (&kc_cpu, &vc_cpu),
                    at(paged, col, &index),
                )
                .expect("composed");
                for dtype in [DType::F32, DType::BF16] {
                    let on = |t: &Tensor| {
                        t.to_dtype(dtype)
                            .and_then(|t| t.to_device(&gpu))
                            .expect("to")
                    };
                    let (kc_gpu, vc_gpu) = (on(&kc), on(&vc));
                    let gpu_index = index.to_device(&gpu).expect("index");
                    let gpu_norms = norms(&on(&qw), &on(&kw));
                    let q_gpu = fused::qk_norm_rope_cache(
                        &on(&super::fused::packed_qkv(&q, &k, &v)),
                        (h, kv),
                        gpu_norms.as_ref().map(|(a, b)| fused::QkNorms {
                            q: a,
                            k: b,
                            eps: 1e-6,
                        }),
                        &on(&cos),
                        &on(&sin),
                        (&kc_gpu, &vc_gpu),
                        at(paged, col, &gpu_index),
                    )
                    .expect("fused")
                    .expect("the fused kernel applies on CUDA");
                    let what = format!("head dim {d}, paged {paged}, norms {norm}, {dtype:?}");
                    // the whole cache: a row written where it should not be fails as one not written
                    for (name, got, want) in [
                        ("q", &q_gpu, &q_cpu),
                        ("k cache", &kc_gpu, &kc_cpu),
                        ("v cache", &vc_gpu, &vc_cpu),
                    ] {
                        let e = rel_err(got, want);
                        assert!(e <= tolerance(dtype), "{what}: {name} relative error {e}");
                    }
                }
            }
        }
    }
    // the residual add and the next RMSNorm, rows of the hidden size
    let (x, a, w) = (
        random(21, &[5, 1, 300], 2.0),
        random(22, &[5, 1, 300], 2.0),
        random(23, &[300], 1.0),
    );
    let (h_cpu, y_cpu) = fused::add_rms_norm_composed(&x, &a, &w, 1e-6).expect("composed");
    for dtype in [DType::F32, DType::BF16] {
        let on = |t: &Tensor| {
            t.to_dtype(dtype)
                .and_then(|t| t.to_device(&gpu))
                .expect("to")
        };
        let (h_gpu, y_gpu) = fused::add_rms_norm(&on(&x), &on(&a), &on(&w), 1e-6)
            .expect("fused")
            .expect("the fused kernel applies on CUDA");
        for (name, got, want) in [("sum", &h_gpu, &h_cpu), ("norm", &y_gpu, &y_cpu)] {
            let e = rel_err(got, want);
            assert!(
                e <= tolerance(dtype),
                "add_rms_norm {dtype:?}: {name} relative error {e}"
            );
        }
    }
}

/// A sampling model's decode steps on CUDA (f32) with the fused chain and without it: the same
/// greedy tokens and their log-probabilities within f32's tolerance at every step.
#[test]
fn decoding_with_the_fused_chain_gives_the_composed_chain_s_logits() {
    let Some(gpu) = gpu("decoding_with_the_fused_chain_gives_the_composed_chain_s_logits") else {
        return;
    };
    use acpo::model::{qwen::Qwen, Params, QwenConfig};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3");
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    {
        let dtype = DType::F32;
        let params = Params::load_dir(&dir, dtype, &gpu).expect("weights");
        let fused_model = Qwen::new(&cfg, &params, true).expect("model");
        assert!(
            fused_model.kernels().decode_chain,
            "CUDA's default kernels fuse the chain"
        );
        let composed = fused_model
            .clone()
            .with_kernels(acpo::model::qwen::Kernels {
                decode_chain: false,
                layer_by_hand: false,
                flash_backward: acpo::fused::FlashBackward::Pair,
                ..fused_model.kernels()
            });
        let prompts = vec![vec![5u32, 17, 99, 3], vec![42u32, 7, 1, 8]];
        let greedy = |model: &Qwen| -> Vec<Vec<f32>> {
            let keys = [[0u64; 4], [0, 0, 1, 0]];
            let r = acpo::rollout::SampleRequest::new(acpo::rollout::SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
                top_k: None,
                max_new_tokens: 10,
            });
            acpo::rollout::generate(model, &prompts, &keys, &r)
                .expect("generate")
                .into_iter()
                .map(|c| {
                    c.tokens
                        .iter()
                        .map(|&t| t as f32)
                        .chain(c.log_probs)
                        .collect()
                })
                .collect()
        };
        // The fused kernels ran, each of them once a layer of every decode step (the composed
        // fallback gives the same numbers, so the tokens alone cannot tell), and the composed
        // model launched none.
        let before = acpo::fused::decode_chain_launches();
        let a = greedy(&fused_model);
        let fused = acpo::fused::decode_chain_launches();
        let b = greedy(&composed);
        let (qk, add_norm) = (fused.qk - before.qk, fused.add_norm - before.add_norm);
        assert!(qk > 0, "the fused q/k chain never launched");
        assert_eq!(qk % cfg.num_hidden_layers, 0, "{qk} q/k chain launches");
        assert_eq!(add_norm, 2 * qk, "two adds with their norms a layer");
        assert_eq!(
            acpo::fused::decode_chain_launches(),
            fused,
            "the composed model launched the fused chain"
        );
        for (row, (x, y)) in a.iter().zip(&b).enumerate() {
            let n = x.len() / 2;
            assert_eq!(x[..n], y[..n], "{dtype:?}: row {row}: greedy tokens differ");
            for (p, q) in x[n..].iter().zip(&y[n..]) {
                assert!(
                    (p - q).abs() <= 1e-4 * p.abs().max(1.0),
                    "{dtype:?}: row {row}: log-probs {p} vs {q}"
                );
            }
        }
    }
}

/// The paged sampling engine on CUDA, at a head dim the paged decode kernel takes (64), in f32
/// and bf16: read through the block tables (`flash_decode_paged_*`) and through a gathered
/// view, every prompt gets the dense engine's tokens; so do the responses of a group sharing
/// their prompt's blocks; with the decode chain composed and fused (the paged engine's new keys
/// then written into the pool by `qk_norm_rope_paged_*`).
#[test]
fn the_paged_cache_on_cuda_gives_the_dense_engines_tokens() {
    let Some(gpu) = gpu("the_paged_cache_on_cuda_gives_the_dense_engines_tokens") else {
        return;
    };
    use acpo::model::qwen::{Kernels, Qwen};
    use acpo::model::{init, QwenConfig};
    use acpo::rollout::{self, PagedOptions, SampleRequest, SamplingParams};
    let json = r#"{"model_type": "qwen3", "vocab_size": 128, "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": true, "max_position_embeddings": 256}"#;
    let cfg = QwenConfig::from_json(json, std::path::Path::new("config.json")).expect("config");
    let mut prompts: Vec<Vec<u32>> = vec![
        vec![5, 17, 99],
        vec![1, 2, 3, 4, 5, 6, 7],
        vec![42],
        vec![9; 40],
        vec![3, 1, 4, 1, 5],
    ];
    // a group of four responses of one prompt
    prompts.extend(std::iter::repeat_n(vec![8, 6, 4, 2], 4));
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [4, 2, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 60,
    };
    let eos: Vec<u32> = (0..6).collect();
    for dtype in [DType::F32, DType::BF16] {
        let params = init::random_params(&cfg, 11, DType::F32, &gpu)
            .expect("weights")
            .with_compute(dtype);
        // Both engines run the same element-wise ops: composed, or fused into the decode
        // chain's kernels (the new keys into a dense column or into pool rows, the same bits).
        let base = Qwen::new(&cfg, &params, true).expect("model");
        for (decode_chain, slots) in [
            (false, None),
            (false, Some(3)),
            (true, None),
            (true, Some(3)),
        ] {
            let model = base.clone().with_kernels(Kernels {
                decode_chain,
                layer_by_hand: false,
                flash_backward: acpo::fused::FlashBackward::Pair,
                ..base.kernels()
            });
            let request = || {
                let r = SampleRequest::new(p).eos(eos.clone());
                match slots {
                    Some(n) => r.max_batch(n),
                    None => r,
                }
            };
            let dense = rollout::generate(&model, &prompts, &keys, &request()).expect("dense");
            for tables in [true, false] {
                // In bf16 a product's last bits may depend on its row count, which sharing a
                // prompt's prefill changes: there the paged engine prefills what the dense one
                // does, and only the reads differ.
                let r = request().paged(PagedOptions {
                    tables: Some(tables),
                    share_prompts: dtype == DType::F32,
                    ..Default::default()
                });
                let before = acpo::fused::decode_chain_launches().qk;
                let stores = acpo::fused::pool_store_launches();
                let paged = rollout::generate(&model, &prompts, &keys, &r).expect("paged");
                let launched = acpo::fused::decode_chain_launches().qk - before;
                assert_eq!(
                    launched > 0,
                    decode_chain,
                    "{dtype:?}, tables {tables}: the paged engine's q/k chain launched {launched} times"
                );
                // the prefills' stores into the pool took the kernel, not scatter_set
                assert!(
                    acpo::fused::pool_store_launches() > stores,
                    "{dtype:?}, tables {tables}: no pool store launched"
                );
                for (i, (a, b)) in paged.iter().zip(&dense).enumerate() {
                    assert_eq!(
                        a.tokens, b.tokens,
                        "{dtype:?}, chain {decode_chain}, tables {tables}, {slots:?} slots, prompt {i}: tokens differ"
                    );
                }
            }
        }
    }
}

/// The first valid key of each row, made once a forward for every layer's flash call
/// (`fused::ValidKeys::new`, `flash_first_valid`): the host's count of each row's leading
/// padding, S for a row of padding only; and a flash call given it computes what one finding
/// it itself does, bit for bit.
#[test]
fn the_first_valid_keys_made_once_are_each_rows_leading_padding() {
    let Some(gpu) = gpu("the_first_valid_keys_made_once_are_each_rows_leading_padding") else {
        return;
    };
    use acpo::fused::{self, ValidKeys};
    let s = 300usize;
    let pads = [0usize, 1, 37, 299, 300];
    let mask: Vec<u8> = pads
        .iter()
        .flat_map(|&p| (0..s).map(move |j| u8::from(j >= p)))
        .collect();
    let valid = Tensor::from_vec(mask, (pads.len(), s), &gpu).expect("mask");
    let keys = ValidKeys::new(&valid).expect("keys");
    let first = keys
        .first
        .as_ref()
        .expect("made on CUDA")
        .to_vec1::<u32>()
        .expect("first");
    let want: Vec<u32> = pads.iter().map(|&p| p as u32).collect();
    assert_eq!(first, want);
    // one query position a row after s − 1 cached ones (the decode kernel), and a prefill of
    // all s (the forward kernel), rows 0..4 (a row of padding only has no query to attend)
    let valid = valid.narrow(0, 0, 4).expect("rows");
    let keys = ValidKeys::new(&valid).expect("keys");
    for (t, past) in [(1usize, s - 1), (s, 0)] {
        let q = random(61, &[4, 4, t, 64], 1.0).to_device(&gpu).expect("q");
        let k = random(62, &[4, 2, s, 64], 1.0).to_device(&gpu).expect("k");
        let v = random(63, &[4, 2, s, 64], 1.0).to_device(&gpu).expect("v");
        let pair = fused::FlashBackward::Pair;
        let given =
            fused::flash_attention_keys(&q, &k, &v, &keys, past, 0.125, pair).expect("given");
        let own = fused::flash_attention(&q, &k, &v, &valid, past, 0.125, pair).expect("own");
        let bits = |t: &Tensor| super::fused::bits(&t.to_device(&Device::Cpu).expect("to"));
        assert_eq!(bits(&given), bits(&own), "T = {t}: the outputs differ");
    }
}

/// The rotary tables' kernel (`fused::rope_tables`, kernels/rope.cu) runs candle's own f32
/// operations (the cast of each position, one product, cosf/sinf, the round to the dtype):
/// on the GPU its tables are candle's composed tables bit for bit, and within the tolerance of
/// the CPU's (whose cos and sin are the host's).
#[test]
fn the_rotary_tables_kernel_is_candles_composed_tables_bit_for_bit() {
    let Some(gpu) = gpu("the_rotary_tables_kernel_is_candles_composed_tables_bit_for_bit") else {
        return;
    };
    for (b, t, d, max) in [(64, 1, 128, 9_220), (2, 300, 128, 40_960), (3, 5, 64, 7)] {
        let (pos_cpu, inv_cpu) = super::fused::rope_table_inputs(b, t, d, max);
        let on_gpu = |x: &Tensor| x.to_device(&gpu).expect("to the GPU");
        let (pos, inv) = (on_gpu(&pos_cpu), on_gpu(&inv_cpu));
        for dtype in [DType::F32, DType::BF16] {
            let (cos, sin) = acpo::fused::rope_tables(&pos, &inv, dtype)
                .expect("tables")
                .expect("the kernel applies on CUDA");
            let (want_cos, want_sin) = super::fused::composed_rope_tables(&pos, &inv, dtype);
            let (cpu_cos, cpu_sin) = super::fused::composed_rope_tables(&pos_cpu, &inv_cpu, dtype);
            let host = |t: &Tensor| {
                super::fused::bits(
                    &t.to_device(&Device::Cpu)
                        .and_then(|t| t.to_dtype(DType::F32))
                        .expect("to host"),
                )
            };
            for (what, got, want, cpu) in [
                ("cos", &cos, &want_cos, &cpu_cos),
                ("sin", &sin, &want_sin, &cpu_sin),
            ] {
                assert_eq!(got.dims(), &[b, 1, t, d]);
                assert_eq!(
                    host(got),
                    host(want),
                    "{what} {dtype:?} {b}x{t}x{d}: not candle's bits"
                );
                let err = rel_err(got, cpu);
                println!("rope table {what} {dtype:?} {b}x{t}x{d}: relative error against the CPU {err:.2e}");
                assert!(err <= tolerance(dtype), "{what} {dtype:?}: {err:.2e}");
            }
        }
    }
}

/// An FP8 KV cache on CUDA (issue #57): the decode kernel reading E4M3 bytes
/// (`flash_decode_pipe_*_fp8`) gives the bits the bf16 kernel gives on the same values held in
/// bf16, at Qwen3-1.7B's heads (16 over 8, head dim 128) with ragged rows and room in the
/// buffers; a prefill's attention over the bytes is refused (the model casts them first).
#[test]
fn the_fp8_decode_kernel_gives_the_bf16_kernels_bits_on_the_same_values() {
    let Some(gpu) = gpu("the_fp8_decode_kernel_gives_the_bf16_kernels_bits_on_the_same_values")
    else {
        return;
    };
    use acpo::fused;
    use acpo::model::qwen::to_fp8_e4m3;
    let (h, kv, d, cap, s) = (16usize, 8usize, 128usize, 1100usize, 1000usize);
    let lens = [1000usize, 431, 1, 129];
    let b = lens.len();
    let scale = 1.0 / (d as f64).sqrt();
    let valid: Vec<u8> = lens
        .iter()
        .flat_map(|&n| (0..s).map(move |j| u8::from(j >= s - n)))
        .collect();
    let valid = Tensor::from_vec(valid, (b, s), &gpu).expect("valid");
    let on_gpu = |t: Tensor| {
        t.to_dtype(DType::BF16)
            .and_then(|t| t.to_device(&gpu))
            .expect("to")
    };
    let q = on_gpu(random(1, &[b, h, 1, d], 1.0));
    // every 97th key beyond ±448 (saturated), the rest wide enough for subnormals and 2⁸
    let keys = random(2, &[b, kv, cap, d], 8.0)
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .expect("keys")
        .into_iter()
        .enumerate()
        .map(|(i, x)| if i % 97 == 0 { 600.0 * x.signum() } else { x })
        .collect::<Vec<f32>>();
    let keys = Tensor::from_vec(keys, (b, kv, cap, d), &Device::Cpu).expect("keys");
    let k8 = to_fp8_e4m3(&on_gpu(keys)).expect("k");
    let v8 = to_fp8_e4m3(&on_gpu(random(3, &[b, kv, cap, d], 1.0))).expect("v");
    assert_eq!(k8.dtype(), DType::U8);
    let (kb, vb) = (
        fused::from_fp8_bytes(&k8, DType::BF16).expect("k"),
        fused::from_fp8_bytes(&v8, DType::BF16).expect("v"),
    );
    let largest = kb
        .abs()
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.max_all())
        .and_then(|t| t.to_scalar::<f32>())
        .expect("max");
    assert_eq!(largest, 448.0, "no key saturated");
    let pair = fused::FlashBackward::Pair;
    let bytes = fused::flash_attention(&q, &k8, &v8, &valid, s - 1, scale, pair).expect("fp8");
    let values = fused::flash_attention(&q, &kb, &vb, &valid, s - 1, scale, pair).expect("bf16");
    let bits = |t: &Tensor| -> Vec<u32> {
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("host")
            .into_iter()
            .map(f32::to_bits)
            .collect()
    };
    assert_eq!(bytes.dtype(), DType::BF16);
    assert!(
        bits(&bytes) == bits(&values),
        "the FP8 kernel's output differs from the bf16 kernel's on the same values"
    );
    // two query positions (a prefill) over the bytes: a clear error, not a wrong read
    let q2 = on_gpu(random(4, &[b, h, 2, d], 1.0));
    let err = fused::flash_attention(&q2, &k8, &v8, &valid, s - 2, scale, pair)
        .expect_err("a prefill over FP8 bytes");
    assert!(err.to_string().contains("FP8"), "{err}");
}

/// A bf16 Qwen3 (head dim 64, the decode kernel's) sampling over an FP8 KV cache on CUDA: the
/// cache holds E4M3 bytes (one a number), and through the composed decode chain every prompt
/// gets the tokens and log-probs, bit for bit, that the same model gets with the E4M3 values
/// held in bf16 (`Fp8E4m3Values`, what the CPU keeps): all at once and by continuous batching
/// (rows joining and leaving the byte buffers); a decode step through the fused chain (the
/// bytes written by `qk_norm_rope_cache_bf16_fp8`) the composed chain's hidden states within
/// bf16's tolerance; and over the paged pool of bytes, the dense byte cache's tokens.
#[test]
fn sampling_over_an_fp8_cache_on_cuda_gives_the_emulated_caches_tokens() {
    let Some(gpu) = gpu("sampling_over_an_fp8_cache_on_cuda_gives_the_emulated_caches_tokens")
    else {
        return;
    };
    use acpo::model::qwen::{Kernels, KvCacheDtype, Qwen};
    use acpo::model::{init, QwenConfig};
    use acpo::rollout::{self, PagedOptions, SampleRequest, SamplingParams};
    let json = r#"{"model_type": "qwen3", "vocab_size": 128, "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": true, "max_position_embeddings": 256}"#;
    let cfg = QwenConfig::from_json(json, std::path::Path::new("config.json")).expect("config");
    let prompts: Vec<Vec<u32>> = vec![
        vec![5, 17, 99],
        vec![1, 2, 3, 4, 5, 6, 7],
        vec![42],
        vec![9; 40],
        vec![3, 1, 4, 1, 5],
    ];
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [5, 7, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 50,
    };
    let eos: Vec<u32> = (0..6).collect();
    let params = init::random_params(&cfg, 12, DType::F32, &gpu)
        .expect("weights")
        .with_compute(DType::BF16);
    let base = Qwen::new(&cfg, &params, true).expect("model");
    let bytes = base
        .clone()
        .with_kv_cache(KvCacheDtype::Fp8E4m3)
        .expect("fp8");
    let values = base
        .with_kv_cache(KvCacheDtype::Fp8E4m3Values)
        .expect("values");
    assert_eq!((bytes.kv_elem_bytes(), values.kv_elem_bytes()), (1, 2));
    // the cache a forward leaves holds bytes
    let ids = Tensor::new(&[[5u32, 17, 99]], &gpu).expect("ids");
    let positions = Tensor::new(&[[0u32, 1, 2]], &gpu).expect("positions");
    let key_valid = Tensor::ones((1, 3), DType::U8, &gpu).expect("valid");
    let (_, cache) = bytes
        .forward_hidden(&ids, &positions, &key_valid, None)
        .expect("forward");
    assert!(cache
        .layers()
        .iter()
        .all(|(k, v)| k.dtype() == DType::U8 && v.dtype() == DType::U8));
    let chain = |m: &Qwen, decode_chain: bool| {
        m.clone().with_kernels(Kernels {
            decode_chain,
            ..m.kernels()
        })
    };
    let bits =
        |c: &rollout::Completion| -> Vec<u32> { c.log_probs.iter().map(|x| x.to_bits()).collect() };
    for slots in [None, Some(2)] {
        let request = || {
            let r = SampleRequest::new(p).eos(eos.clone());
            match slots {
                Some(n) => r.max_batch(n),
                None => r,
            }
        };
        // The composed chain on both sides: the same ops, the bytes' values read back exactly.
        let before = acpo::fused::decode_chain_launches();
        let a = rollout::generate(&chain(&bytes, false), &prompts, &keys, &request())
            .expect("fp8 bytes");
        let b = rollout::generate(&chain(&values, false), &prompts, &keys, &request())
            .expect("fp8 values");
        assert_eq!(
            acpo::fused::decode_chain_launches(),
            before,
            "a fused chain ran"
        );
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            assert_eq!(
                a.tokens, b.tokens,
                "{slots:?} slots, prompt {i}: tokens differ"
            );
            assert_eq!(
                bits(a),
                bits(b),
                "{slots:?} slots, prompt {i}: log-probs differ"
            );
        }
    }
    // The fused chain writing the bytes (`qk_norm_rope_cache_bf16_fp8`): one decode step from
    // the same prefilled byte cache through each chain gives the same hidden states within
    // bf16's tolerance (the fused chain's q/k/v are one stacked product, whose last bits may
    // differ from three products'; whole runs at T = 1 then drift apart in bf16); a whole run
    // through it completes, launching it.
    let decode_step = |m: &Qwen| -> Tensor {
        let room = acpo::model::qwen::KvCache::with_reserve(4);
        let (_, cache) = m
            .forward_hidden(&ids, &positions, &key_valid, Some(&room))
            .expect("prefill");
        let next = Tensor::new(&[[7u32]], &gpu).expect("id");
        let at = Tensor::new(&[[3u32]], &gpu).expect("position");
        let valid = Tensor::ones((1, 4), DType::U8, &gpu).expect("valid");
        m.forward_hidden(&next, &at, &valid, Some(&cache))
            .expect("decode step")
            .0
    };
    let before = acpo::fused::decode_chain_launches().qk;
    let fused_step = decode_step(&chain(&bytes, true));
    assert!(
        acpo::fused::decode_chain_launches().qk > before,
        "the fused q/k chain never launched"
    );
    let e = rel_err(&fused_step, &decode_step(&chain(&bytes, false)));
    assert!(
        e <= tolerance(DType::BF16),
        "fused vs composed decode step: {e}"
    );
    let before = acpo::fused::decode_chain_launches().qk;
    let fused = rollout::generate(
        &chain(&bytes, true),
        &prompts,
        &keys,
        &SampleRequest::new(p).eos(eos.clone()),
    )
    .expect("fp8 bytes, fused chain");
    assert_eq!(fused.len(), prompts.len());
    assert!(acpo::fused::decode_chain_launches().qk > before);
    // The paged pool holds the bytes too, written by a prefill's store, each decode step's
    // chain (fused, into the pool rows) and copy on write, and read by the paged kernel's
    // `*_fp8` instance or through a gathered view: the dense byte cache's tokens.
    let dense = rollout::generate(
        &bytes,
        &prompts,
        &keys,
        &SampleRequest::new(p).eos(eos.clone()),
    )
    .expect("dense fp8");
    for tables in [true, false] {
        let r = SampleRequest::new(p).eos(eos.clone()).paged(PagedOptions {
            tables: Some(tables),
            share_prompts: false,
            ..Default::default()
        });
        let paged = rollout::generate(&bytes, &prompts, &keys, &r).expect("paged fp8");
        for (i, (a, b)) in paged.iter().zip(&dense).enumerate() {
            assert_eq!(
                a.tokens, b.tokens,
                "tables {tables}, prompt {i}: tokens differ"
            );
        }
    }
}

/// `kernels/fp8.cu` against its CPU twin (`fused::to_fp8_bytes`, `from_fp8_bytes`): every bf16
/// number rounded to the same E4M3 byte, every byte back to the same bf16 and f32 bits.
#[test]
fn the_fp8_kernels_round_and_read_as_their_cpu_twin() {
    let Some(gpu) = gpu("the_fp8_kernels_round_and_read_as_their_cpu_twin") else {
        return;
    };
    use acpo::fused::{from_fp8_bytes, to_fp8_bytes};
    let all: Vec<f32> = (0..=u16::MAX)
        .map(|b| f32::from_bits(u32::from(b) << 16))
        .collect();
    let cpu = Tensor::from_vec(all, 1 << 16, &Device::Cpu)
        .and_then(|t| t.to_dtype(DType::BF16))
        .expect("bf16");
    let bytes = |t: &Tensor| -> Vec<u8> {
        to_fp8_bytes(t)
            .and_then(|b| b.to_device(&Device::Cpu))
            .and_then(|b| b.to_vec1::<u8>())
            .expect("bytes")
    };
    assert_eq!(bytes(&cpu.to_device(&gpu).expect("up")), bytes(&cpu));
    let codes = Tensor::from_vec((0..=255u8).collect::<Vec<u8>>(), 256, &Device::Cpu).expect("u8");
    for dtype in [DType::F32, DType::BF16] {
        let read = |t: &Tensor| -> Vec<u32> {
            from_fp8_bytes(t, dtype)
                .and_then(|v| v.to_dtype(DType::F32))
                .and_then(|v| v.to_device(&Device::Cpu))
                .and_then(|v| v.to_vec1::<f32>())
                .expect("values")
                .into_iter()
                .map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() })
                .collect()
        };
        assert_eq!(
            read(&codes.to_device(&gpu).expect("up")),
            read(&codes),
            "{dtype:?}"
        );
    }
}
