//! src/model and src/rollout against transformers: `tools/oracles/ref_model.py` (torch + transformers,
//! CPU, f32) wrote the tiny checkpoints in tests/fixtures/tiny-qwen{2,3}/ and
//! tests/fixtures/model_reference.json.

use std::path::{Path, PathBuf};

use acpo::hub::{self, HubOptions};
use acpo::model::qwen::{Critic, Qwen};
use acpo::model::tokenizer::{Message, Tokenizer};
use acpo::model::{init, Params, QwenConfig};
use acpo::rollout::{self, FinishReason, SampleRequest, SamplingParams};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub(crate) fn reference() -> Value {
    let text = std::fs::read_to_string(fixtures().join("model_reference.json")).expect("fixture");
    serde_json::from_str(&text).expect("json")
}

fn load(name: &str) -> (QwenConfig, Params) {
    let dir = fixtures().join(name);
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    let params = Params::load_dir(&dir, DType::F32, &Device::Cpu).expect("weights");
    (cfg, params)
}

/// Hidden states for unpadded rows of equal length, on the model's device.
pub(crate) fn forward_full(model: &Qwen, ids: &[Vec<u32>]) -> Tensor {
    let (b, t) = (ids.len(), ids[0].len());
    let dev = model.device().clone();
    let x = Tensor::from_vec(ids.concat(), (b, t), &dev).expect("ids");
    let pos = Tensor::from_vec(
        (0..b).flat_map(|_| 0..t as u32).collect::<Vec<_>>(),
        (b, t),
        &dev,
    )
    .expect("pos");
    let valid = Tensor::ones((b, t), DType::U8, &dev).expect("mask");
    model
        .forward_hidden(&x, &pos, &valid, None)
        .expect("forward")
        .0
}

pub(crate) fn ids_of(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect()
        })
        .collect()
}

/// transformers' logits of `model_reference.json`'s input ids for the fixture `name`, flat.
pub(crate) fn reference_logits(r: &Value, name: &str) -> Vec<f32> {
    r["models"][name]["logits"]
        .as_array()
        .expect("b")
        .iter()
        .flat_map(|b| b.as_array().expect("t").iter())
        .flat_map(|t| {
            t.as_array()
                .expect("v")
                .iter()
                .map(|x| x.as_f64().expect("f") as f32)
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn logits_match_transformers_for_qwen3_and_sharded_qwen2() {
    let r = reference();
    let ids = ids_of(&r["input_ids"]);
    for name in ["tiny-qwen3", "tiny-qwen2"] {
        let (cfg, params) = load(name);
        let model = Qwen::new(&cfg, &params, true).expect("model");
        let logits = model.logits(&forward_full(&model, &ids)).expect("logits");
        let got: Vec<f32> = logits.flatten_all().expect("flat").to_vec1().expect("vec");
        let want = reference_logits(&r, name);
        assert_eq!(got.len(), want.len());
        let d = max_abs_diff(&got, &want);
        assert!(d < 1e-4, "{name}: max |Δlogit| = {d}");
        // bf16 arithmetic (fp32 masters cast once): the error budget the CUDA test measures its
        // bf16 logits against.
        let e = bf16_logits_rel_err(name, &Device::Cpu);
        eprintln!("{name}: CPU bf16 logits, relative error {e:.2e} against transformers (f32)");
        assert!(
            e > 0.0 && e < 3e-2,
            "{name}: CPU bf16 logits off by {e:.2e}"
        );
    }
}

/// ‖bf16 logits − transformers' f32 logits‖ / ‖transformers'‖ for the fixture model `name` on
/// `device`: fp32 weights, bf16 compute (`Precision::inference(Bf16)`).
pub(crate) fn bf16_logits_rel_err(name: &str, device: &Device) -> f64 {
    let r = reference();
    let ids = ids_of(&r["input_ids"]);
    let dir = fixtures().join(name);
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    let p = acpo::model::Precision::inference(acpo::model::spec::DType::Bf16);
    let params = Params::load_dir(&dir, p.master, device)
        .expect("weights")
        .with_compute(p.compute);
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let got: Vec<f64> = model
        .logits(&forward_full(&model, &ids))
        .expect("logits")
        .to_dtype(DType::F64)
        .and_then(|l| l.flatten_all())
        .and_then(|l| l.to_vec1())
        .expect("to host");
    let want = reference_logits(&r, name);
    let num: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, &b)| (a - b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn greedy_sampling_with_the_kv_cache_reproduces_transformers_tokens() {
    let r = reference();
    for name in ["tiny-qwen3", "tiny-qwen2"] {
        let (cfg, params) = load(name);
        let model = Qwen::new(&cfg, &params, true).expect("model");
        let prompt: Vec<u32> = ids_of(&Value::Array(vec![
            r["models"][name]["greedy_prompt"].clone()
        ]))
        .remove(0);
        let want: Vec<u32> =
            ids_of(&Value::Array(vec![r["models"][name]["greedy"].clone()])).remove(0);
        let p = SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: want.len(),
        };
        let out = rollout::generate(&model, &[prompt], &[[0; 4]], &SampleRequest::new(p))
            .expect("generate");
        assert_eq!(out[0].tokens, want, "{name}: greedy continuation");
        assert_eq!(out[0].finish, FinishReason::Length);
    }
}

/// The largest |Δ| over positions 6.. between `model`'s logits decoded one token at a time
/// through its cache after a 6-token prefill and its logits of the whole sequence at once, and
/// the cached logits themselves.
fn cached_decode_against_full_recomputation(model: &Qwen) -> (f32, Vec<f32>) {
    let seq: Vec<u32> = vec![5, 17, 99, 3, 64, 2, 127, 40, 8, 11];
    let dev = Device::Cpu;
    // Prefill 6 tokens, then feed the remaining 4 one at a time through the cache.
    let (_, mut cache) = {
        let x = Tensor::new(&seq[..6], &dev)
            .expect("ids")
            .unsqueeze(0)
            .expect("b");
        let pos = Tensor::arange(0u32, 6, &dev)
            .expect("pos")
            .unsqueeze(0)
            .expect("b");
        model
            .forward_hidden(
                &x,
                &pos,
                &Tensor::ones((1, 6), DType::U8, &dev).expect("m"),
                None,
            )
            .expect("prefill")
    };
    let full = model
        .logits(&forward_full(model, std::slice::from_ref(&seq)))
        .expect("logits");
    let (mut worst, mut cached) = (0f32, Vec::new());
    for (t, &token) in seq.iter().enumerate().skip(6) {
        let x = Tensor::new(&[[token]], &dev).expect("id");
        let pos = Tensor::new(&[[t as u32]], &dev).expect("pos");
        let valid = Tensor::ones((1, t + 1), DType::U8, &dev).expect("m");
        let (h, c) = model
            .forward_hidden(&x, &pos, &valid, Some(&cache))
            .expect("step");
        cache = c;
        let step: Vec<f32> = model
            .logits(&h)
            .expect("l")
            .flatten_all()
            .expect("f")
            .to_vec1()
            .expect("v");
        let want: Vec<f32> = full
            .narrow(1, t, 1)
            .expect("n")
            .flatten_all()
            .expect("f")
            .to_vec1()
            .expect("v");
        worst = worst.max(max_abs_diff(&step, &want));
        cached.extend(step);
    }
    assert_eq!(cache.len(), seq.len());
    (worst, cached)
}

#[test]
fn kv_cache_decoding_equals_full_recomputation() {
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let (d, _) = cached_decode_against_full_recomputation(&model);
    assert!(d < 1e-4, "cached vs full |Δ| = {d}");
}

/// Every finite FP8 E4M3 value, decoded from its bits by the format's definition (OCP 8-bit
/// floating point, E4M3: bias 7, 3 mantissa bits, subnormals at exponent 0, no infinities,
/// S.1111.111 NaN), independently of the library that converts.
fn e4m3_values() -> Vec<(u8, f64)> {
    (0u8..=255)
        .filter(|b| b & 0x7f != 0x7f)
        .map(|b| {
            let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
            let (e, m) = (i32::from((b >> 3) & 0xf), f64::from(b & 0x7));
            let mag = if e == 0 {
                m / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            (b, sign * mag)
        })
        .collect()
}

#[test]
fn the_fp8_kv_cache_rounds_to_the_nearest_e4m3_value_ties_to_even_saturating() {
    use acpo::model::qwen::fp8_e4m3;
    let table = e4m3_values();
    assert_eq!(
        table.iter().map(|t| t.1).fold(0f64, f64::max),
        acpo::model::qwen::FP8_E4M3_MAX
    );
    // Inputs: every value, every midpoint between neighbours (ties), points beside them, and a
    // spread of ordinary numbers, beyond ±448 included.
    let mut sorted: Vec<f64> = table.iter().map(|t| t.1).collect();
    sorted.sort_by(f64::total_cmp);
    sorted.dedup();
    let mut xs: Vec<f32> = Vec::new();
    for w in sorted.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        xs.extend([
            w[0] as f32,
            mid as f32,
            (mid * 1.01) as f32,
            (mid * 0.99) as f32,
        ]);
    }
    xs.extend((-600..=600).map(|i| i as f32 * 0.7531));
    xs.extend([1e-9f32, -1e-9, 500.0, -1e6, 1e6]);
    let got: Vec<f32> = fp8_e4m3(&Tensor::new(xs.as_slice(), &Device::Cpu).expect("x"))
        .expect("fp8")
        .to_vec1()
        .expect("v");
    for (&x, &g) in xs.iter().zip(&got) {
        let x = f64::from(x).clamp(-448.0, 448.0);
        let best = sorted
            .iter()
            .map(|&v| (v - x).abs())
            .fold(f64::INFINITY, f64::min);
        // the nearest value; of two at the same distance, the one with an even mantissa
        let near: Vec<&(u8, f64)> = table
            .iter()
            .filter(|t| (t.1 - x).abs() == best && (t.1 != 0.0 || t.0 == 0))
            .collect();
        let want = if near.len() > 1 {
            near.iter().find(|t| t.0 & 1 == 0).expect("an even one").1
        } else {
            near[0].1
        };
        assert_eq!(f64::from(g), want, "{x}");
    }
}

#[test]
fn an_fp8_kv_cache_holds_keys_and_values_rounded_in_prefill_and_decode_alike() {
    use acpo::model::qwen::KvCacheDtype;
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let fp8 = Qwen::new(&cfg, &params, true)
        .expect("model")
        .with_kv_cache(KvCacheDtype::Fp8E4m3)
        .expect("cpu");
    // The rounding applies wherever a key or value is cached: decoding through the cache and
    // recomputing the whole sequence agree under FP8 as they do without it.
    let (d, rounded) = cached_decode_against_full_recomputation(&fp8);
    assert!(d < 1e-4, "FP8: cached vs full |Δ| = {d}");
    // It changes the logits, by about E4M3's relative precision (2^-4) at most.
    let (_, plain) = cached_decode_against_full_recomputation(&model);
    let shift = max_abs_diff(&rounded, &plain);
    let scale = plain.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        shift > 0.0 && shift < 0.25 * scale,
        "|Δ| {shift} of {scale}"
    );
}

#[test]
fn sampling_gives_the_same_bits_on_any_number_of_threads() {
    // A completion's logits depend in their last bits on the batch it is decoded in, so the
    // batch must not depend on the threads (issue #48: the CPU used to cut it into one group
    // per thread). 40 prompts of uneven lengths: decode steps above and below the small-row
    // kernel's 16 rows, prefills through gemm.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompts: Vec<Vec<u32>> = (0..40u32)
        .map(|i| (0..(3 + i % 7)).map(|j| (7 * i + 3 * j) % 128).collect())
        .collect();
    let keys: Vec<[u64; 4]> = (0..40).map(|i| [3, 2, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 0.9,
        top_k: None,
        max_new_tokens: 8,
    };
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
            .install(|| {
                rollout::generate(&model, &prompts, &keys, &SampleRequest::new(p))
                    .expect("generate")
            })
    };
    let bits =
        |c: &rollout::Completion| c.log_probs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let one = run(1);
    for threads in [2, 4, 8] {
        let other = run(threads);
        for (i, (a, b)) in one.iter().zip(&other).enumerate() {
            assert_eq!(a.tokens, b.tokens, "prompt {i}, {threads} threads");
            assert_eq!(bits(a), bits(b), "prompt {i}, {threads} threads: log-probs");
        }
    }
}

#[test]
fn left_padded_batches_give_each_sequence_its_solo_result() {
    let (cfg, params) = load("tiny-qwen2");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompts = vec![vec![5u32, 17, 99], vec![1, 2, 3, 4, 5, 6, 7], vec![42]];
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 6,
    };
    let keys: Vec<[u64; 4]> = (0..3).map(|i| [7, 1, i, 0]).collect();
    let batched =
        rollout::generate(&model, &prompts, &keys, &SampleRequest::new(p)).expect("batched");
    for i in 0..3 {
        let solo = rollout::generate(
            &model,
            &prompts[i..=i],
            &keys[i..=i],
            &SampleRequest::new(p),
        )
        .expect("solo");
        assert_eq!(
            batched[i].tokens, solo[0].tokens,
            "prompt {i}: tokens depend on batch composition"
        );
        assert!(max_abs_diff(&batched[i].log_probs, &solo[0].log_probs) < 1e-5);
    }
    // The sampler's log-probs are the policy's: recompute them by a full forward pass.
    let seq: Vec<u32> = prompts[1]
        .iter()
        .chain(&batched[1].tokens)
        .copied()
        .collect();
    let hidden = forward_full(&model, std::slice::from_ref(&seq));
    let n = prompts[1].len();
    let targets = Tensor::new(&seq[n..], &Device::Cpu)
        .expect("t")
        .unsqueeze(0)
        .expect("b");
    let h = hidden.narrow(1, n - 1, seq.len() - n).expect("h");
    let (lp, _) = model
        .token_log_probs(&h, &targets, 1.0, 2, false)
        .expect("lp");
    let lp: Vec<f32> = lp.flatten_all().expect("f").to_vec1().expect("v");
    assert!(
        max_abs_diff(&lp, &batched[1].log_probs) < 1e-4,
        "{lp:?} vs {:?}",
        batched[1].log_probs
    );
}

#[test]
fn sampling_is_seeded_per_sample_and_truncation_behaves() {
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompt = vec![vec![3u32, 9, 27]];
    let run = |key: [u64; 4], p: SamplingParams| {
        rollout::generate(&model, &prompt, &[key], &SampleRequest::new(p))
            .expect("generate")
            .remove(0)
            .tokens
    };
    let t1 = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 16,
    };
    assert_eq!(
        run([1, 2, 3, 4], t1),
        run([1, 2, 3, 4], t1),
        "same key, same sample"
    );
    assert_ne!(
        run([1, 2, 3, 4], t1),
        run([1, 2, 3, 5], t1),
        "another sample index, another sample"
    );
    let greedy = run(
        [0; 4],
        SamplingParams {
            temperature: 0.0,
            ..t1
        },
    );
    assert_eq!(
        run(
            [9, 9, 9, 9],
            SamplingParams {
                top_k: Some(1),
                ..t1
            }
        ),
        greedy,
        "top-k 1 is greedy"
    );
    assert_eq!(
        run([9, 9, 9, 8], SamplingParams { top_p: 1e-6, ..t1 }),
        greedy,
        "tiny top-p is greedy"
    );
}

/// Top-k and top-p against the distribution they define, computed here independently: sort
/// by logit (larger first, −0 equal to +0, ties by lower index), keep the first k, then the
/// shortest prefix with at least top_p of their probability; each kept token is drawn with its
/// renormalised probability and no other token ever. The logits tie at both cuts.
#[test]
fn truncated_sampling_draws_each_kept_token_at_its_renormalised_probability() {
    use acpo::rng::SplitMix64;
    use acpo::rollout::sample_token;
    let logits = [0.5f32, 2.0, 1.0, -0.0, 1.0, 0.0, -3.0, 0.5];
    let prob: Vec<f64> = {
        let e: Vec<f64> = logits.iter().map(|&x| f64::from(x).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    };
    // the order by hand: 2.0 (1), 1.0 (2, 4), 0.5 (0, 7), 0 (3 is −0, 5), −3 (6)
    let order = [1usize, 2, 4, 0, 7, 3, 5, 6];
    let prefix = |n: usize| order[..n].iter().map(|&i| prob[i]).sum::<f64>();
    // a top-p share halfway between the first n and n + 1 tokens' of the first `of`
    let between = |n: usize, of: usize| (prefix(n) + prefix(n + 1)) / 2.0 / prefix(of);
    let cases = [
        (None, 1.0, vec![1, 2, 4, 0, 7, 3, 5, 6]),
        (Some(3), 1.0, vec![1, 2, 4]),
        // top-k cutting the 0.5s' tie and the zeros' (−0 first, by index)
        (Some(4), 1.0, vec![1, 2, 4, 0]),
        (Some(6), 1.0, vec![1, 2, 4, 0, 7, 3]),
        // top-p cutting the 1.0s' tie, and after it; then of the top 5
        (None, between(1, 8), vec![1, 2]),
        (None, between(2, 8), vec![1, 2, 4]),
        (Some(5), between(3, 5), vec![1, 2, 4, 0]),
        (Some(1), 1.0, vec![1]),
        (None, 1e-9, vec![1]),
    ];
    let draws = 40_000;
    for (top_k, top_p, kept) in cases {
        let params = SamplingParams {
            temperature: 1.0,
            top_p,
            top_k,
            max_new_tokens: 1,
        };
        let mut count = [0usize; 8];
        for d in 0..draws {
            let mut rng = SplitMix64::from_key(&[5, d]);
            let (tok, lp) = sample_token(&logits, &params, &mut rng);
            count[tok as usize] += 1;
            // the log-probability is the full distribution's (the policy's), truncated or not
            assert!((f64::from(lp) - prob[tok as usize].ln()).abs() < 1e-6);
        }
        let mass: f64 = kept.iter().map(|&i| prob[i]).sum();
        for (i, &c) in count.iter().enumerate() {
            let want = if kept.contains(&i) {
                prob[i] / mass
            } else {
                0.0
            };
            let got = c as f64 / draws as f64;
            // five standard errors of a binomial share
            let sd = (want * (1.0 - want) / draws as f64).sqrt();
            assert!(
                (got - want).abs() <= 5.0 * sd + 1e-12,
                "top-k {top_k:?} top-p {top_p}: token {i} drawn {got:.4}, want {want:.4} (kept {kept:?})"
            );
        }
    }
}

#[test]
fn eos_and_stop_strings_end_a_completion() {
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let p = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 12,
    };
    let free =
        rollout::generate(&model, &[vec![3u32, 9]], &[[0; 4]], &SampleRequest::new(p)).expect("g");
    let third = free[0].tokens[2];
    let stop = SampleRequest::new(p).eos(vec![third]);
    let out = rollout::generate(&model, &[vec![3u32, 9]], &[[0; 4]], &stop).expect("g");
    let first_eos = free[0]
        .tokens
        .iter()
        .position(|t| *t == third)
        .expect("present");
    assert_eq!(out[0].tokens, free[0].tokens[..=first_eos].to_vec());
    assert_eq!(out[0].finish, FinishReason::Eos);
    // A stop string over a "decoder" that writes token ids as text.
    let decode = |ids: &[u32]| ids.iter().map(|i| format!("<{i}>")).collect::<String>();
    let needle = format!("<{}>", free[0].tokens[4]);
    let stop = SampleRequest::new(p).stop_strings(vec![needle], &decode);
    let out = rollout::generate(&model, &[vec![3u32, 9]], &[[0; 4]], &stop).expect("g");
    assert_eq!(out[0].finish, FinishReason::Stop);
    assert!(out[0].tokens.len() <= 5);
}

#[test]
fn every_parameter_gets_a_gradient_and_a_few_adamw_steps_lower_the_loss() {
    use candle_nn::Optimizer;
    for name in ["tiny-qwen3", "tiny-qwen2"] {
        let (cfg, params) = load(name);
        let ids: Vec<Vec<u32>> = vec![
            vec![5, 17, 99, 3, 64, 2, 127, 40],
            vec![1, 2, 3, 4, 5, 6, 7, 8],
        ];
        let targets = Tensor::new(
            ids.iter().map(|r| r[1..].to_vec()).collect::<Vec<_>>(),
            &Device::Cpu,
        )
        .expect("t");
        let nll = || {
            let model = Qwen::new(&cfg, &params, false).expect("trainable model");
            let h = forward_full(&model, &ids).narrow(1, 0, 7).expect("h");
            let (lp, _) = model
                .token_log_probs(&h, &targets, 1.0, 3, false)
                .expect("lp");
            lp.mean_all().expect("mean").neg().expect("neg")
        };
        let loss0 = nll();
        let grads = loss0.backward().expect("backward");
        let missing: Vec<&String> = params
            .vars()
            .filter(|(_, v)| {
                grads.get(v.as_tensor()).is_none_or(|g| {
                    g.abs()
                        .expect("abs")
                        .sum_all()
                        .expect("s")
                        .to_scalar::<f32>()
                        .expect("s")
                        == 0.0
                })
            })
            .map(|(n, _)| n)
            .collect();
        assert!(
            missing.is_empty(),
            "{name}: no gradient reaches {missing:?}"
        );
        let vars: Vec<candle_core::Var> = params.vars().map(|(_, v)| v.clone()).collect();
        let mut opt = candle_nn::AdamW::new(
            vars,
            candle_nn::ParamsAdamW {
                lr: 1e-2,
                ..Default::default()
            },
        )
        .expect("adamw");
        let first = loss0.to_scalar::<f32>().expect("s");
        let mut last = first;
        for _ in 0..5 {
            let l = nll();
            last = l.to_scalar::<f32>().expect("s");
            opt.backward_step(&l).expect("step");
        }
        assert!(
            last < first * 0.9,
            "{name}: loss {first} -> {last} did not drop"
        );
    }
}

#[test]
fn the_critic_starts_from_the_policy_and_its_values_train() {
    let (cfg, params) = load("tiny-qwen3");
    let critic_params = init::add_value_head(&params, &cfg, 1).expect("head");
    assert!(critic_params.contains("score.weight") && critic_params.contains("score.bias"));
    let critic = Critic::new(&cfg, &critic_params, false).expect("critic");
    let h = forward_full(&critic.backbone, &[vec![1, 2, 3, 4]]);
    let values = critic.values(&h).expect("values");
    assert_eq!(values.dims(), &[1, 4]);
    let grads = values.sum_all().expect("s").backward().expect("backward");
    for (name, var) in critic_params.vars() {
        if name.starts_with("score.") || name.starts_with("model.layers.") {
            assert!(
                grads.get(var.as_tensor()).is_some(),
                "no gradient to {name}"
            );
        }
    }
    // The critic's backbone is a copy: training it leaves the policy's weights alone.
    let (_, pv) = params.vars().next().expect("one");
    let (_, cv) = critic_params.vars().next().expect("one");
    assert_ne!(pv.as_tensor().id(), cv.as_tensor().id());
}

#[test]
fn saved_models_reload_identically() {
    let dir = tempfile::tempdir().expect("tmp");
    let (cfg, params) = load("tiny-qwen2");
    init::save_model(&cfg, &params, dir.path()).expect("save");
    let cfg2 = QwenConfig::load(&dir.path().join("config.json")).expect("config");
    let params2 = Params::load_dir(dir.path(), DType::F32, &Device::Cpu).expect("reload");
    let ids = vec![vec![4u32, 8, 15, 16, 23, 42]];
    let a = Qwen::new(&cfg, &params, true).expect("a");
    let b = Qwen::new(&cfg2, &params2, true).expect("b");
    let la: Vec<f32> = a
        .logits(&forward_full(&a, &ids))
        .expect("l")
        .flatten_all()
        .expect("f")
        .to_vec1()
        .expect("v");
    let lb: Vec<f32> = b
        .logits(&forward_full(&b, &ids))
        .expect("l")
        .flatten_all()
        .expect("f")
        .to_vec1()
        .expect("v");
    assert_eq!(la, lb);
}

#[test]
fn random_models_are_seeded() {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg_path = fixtures().join("tiny-qwen3/config.json");
    let a = init::write_random_model(&cfg_path, &dir.path().join("a"), 5).expect("a");
    let b = init::write_random_model(&cfg_path, &dir.path().join("b"), 5).expect("b");
    let c = init::write_random_model(&cfg_path, &dir.path().join("c"), 6).expect("c");
    let bytes =
        |d: &str| std::fs::read(dir.path().join(d).join("model.safetensors")).expect("read");
    assert_eq!(bytes("a"), bytes("b"));
    assert_ne!(bytes("a"), bytes("c"));
    assert_eq!(a.count(), b.count());
    assert!(c.count() > 0);
    let cfg = QwenConfig::load(&dir.path().join("a/config.json")).expect("config");
    Qwen::new(
        &cfg,
        &Params::load_dir(&dir.path().join("a"), DType::F32, &Device::Cpu).expect("w"),
        true,
    )
    .expect("builds");
}

#[test]
fn the_qwen3_tokenizer_round_trips_problems_like_transformers_and_renders_the_chat_template() {
    let Some(dir) = super::qwen3_tokenizer(
        "the_qwen3_tokenizer_round_trips_problems_like_transformers_and_renders_the_chat_template",
    ) else {
        return;
    };
    let r = reference();
    let tok = Tokenizer::load(&dir).expect("tokenizer");
    for p in r["tokenizer"]["problems"].as_array().expect("problems") {
        let text = p["text"].as_str().expect("text");
        let want: Vec<u32> = p["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        let ids = tok.encode(text).expect("encode");
        assert_eq!(ids, want, "token ids differ from transformers for {text:?}");
        assert_eq!(tok.decode(&ids, false).expect("decode"), text);
    }
    let msgs = [Message::user("What is $1+1$? Put the answer in \\boxed{}.")];
    assert_eq!(
        tok.apply_chat_template(&msgs, true).expect("render"),
        r["tokenizer"]["chat_user"].as_str().expect("s")
    );
    assert_eq!(
        tok.apply_chat_template(&msgs, false).expect("render"),
        r["tokenizer"]["chat_user_no_gen"].as_str().expect("s")
    );
    assert_eq!(
        tok.eos_id(),
        tok.token_id(r["tokenizer"]["eos_token"].as_str().expect("eos"))
    );
}

#[test]
fn every_benchmark_problem_round_trips_through_the_qwen3_tokenizer() {
    let test = "every_benchmark_problem_round_trips_through_the_qwen3_tokenizer";
    let (Some(tok_dir), Some(data)) = (super::qwen3_tokenizer(test), super::real_data(test)) else {
        return;
    };
    let tok = Tokenizer::load(&tok_dir).expect("tokenizer");
    let mut n = 0;
    for f in ["math500", "minerva_math", "olympiadbench", "aime_like"] {
        let text = std::fs::read_to_string(data.join(format!("{f}.jsonl"))).expect("data");
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("json");
            let p = v["problem"].as_str().expect("problem");
            assert_eq!(
                tok.decode(&tok.encode(p).expect("encode"), false)
                    .expect("decode"),
                p,
                "{f}"
            );
            n += 1;
        }
    }
    assert_eq!(n, 500 + 272 + 675 + 230);
}

#[test]
fn hub_models_resolve_from_the_offline_cache_with_a_clear_error_when_absent() {
    let cache = tempfile::tempdir().expect("tmp");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo_dir = cache.path().join("models--acme--tiny");
    let snap = repo_dir.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).expect("mkdir");
    std::fs::create_dir_all(repo_dir.join("refs")).expect("mkdir");
    std::fs::write(repo_dir.join("refs/main"), commit).expect("ref");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("tiny-qwen3").join(f), snap.join(f)).expect("copy");
    }
    acpo::model::init::write_char_tokenizer(&snap).expect("a tokenizer.json");
    let opts = HubOptions {
        cache_dir: cache.path().to_owned(),
        offline: true,
    };
    for revision in ["main", commit] {
        let source = acpo::hub::ModelSource::Hub {
            repo: "acme/tiny".into(),
            revision: revision.into(),
        };
        let dir = hub::resolve(&source, &opts).expect("resolves offline");
        assert_eq!(dir, snap);
        Params::load_dir(&dir, DType::F32, &Device::Cpu).expect("weights load");
    }
    let missing = acpo::hub::ModelSource::Hub {
        repo: "acme/absent".into(),
        revision: "main".into(),
    };
    let err = hub::resolve(&missing, &opts).expect_err("absent");
    let msg = err.to_string();
    assert!(
        msg.contains("acme/absent@main") && msg.contains("offline cache"),
        "{msg}"
    );
}

#[test]
fn broken_checkpoints_name_the_tensor_or_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let (cfg, params) = load("tiny-qwen3");
    let mut vars: std::collections::BTreeMap<String, candle_core::Var> =
        params.vars().map(|(k, v)| (k.clone(), v.clone())).collect();
    vars.remove("model.layers.1.mlp.up_proj.weight");
    let err = Qwen::new(&cfg, &Params::new(vars), true).expect_err("missing tensor");
    assert!(
        err.to_string()
            .contains("model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
    let bad_cfg = dir.path().join("config.json");
    std::fs::write(&bad_cfg, r#"{"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6}"#)
        .expect("write");
    let err = QwenConfig::load(&bad_cfg).expect_err("llama");
    assert!(
        err.to_string().contains("config.json") && err.to_string().contains("llama"),
        "{err}"
    );
    let err = Params::load_dir(dir.path(), DType::F32, &Device::Cpu).expect_err("no weights");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

/// Issue #18 item 3, on the CPU: `dtype: bf16` trains fp32 masters through bf16 arithmetic.
/// Every master gets an fp32 gradient through the casts, the bf16 log-probabilities agree with
/// the f32 model's to bf16 precision, and the trainer's AdamW keeps fp32 moments, so an update
/// of size lr·1e-3 (below bf16's resolution of a weight near 1) still moves the masters.
#[test]
fn bf16_compute_trains_fp32_masters() {
    use acpo::model::Precision;
    let dir = fixtures().join("tiny-qwen3");
    let cfg = QwenConfig::load(&dir.join("config.json")).expect("config");
    let precision = Precision::training(acpo::model::spec::DType::Bf16);
    assert_eq!(
        (precision.master, precision.compute),
        (DType::F32, DType::BF16)
    );
    let mixed = Params::load_dir(&dir, precision.master, &Device::Cpu)
        .expect("weights")
        .with_compute(precision.compute);
    let (_, full) = load("tiny-qwen3");
    let ids: Vec<Vec<u32>> = vec![
        vec![5, 17, 99, 3, 64, 2, 127, 40],
        vec![1, 2, 3, 4, 5, 6, 7, 8],
    ];
    let targets = Tensor::new(
        ids.iter().map(|r| r[1..].to_vec()).collect::<Vec<_>>(),
        &Device::Cpu,
    )
    .expect("t");
    let log_probs = |params: &Params| {
        let model = Qwen::new(&cfg, params, false).expect("trainable model");
        let h = forward_full(&model, &ids).narrow(1, 0, 7).expect("h");
        model
            .token_log_probs(&h, &targets, 1.0, 3, false)
            .expect("lp")
            .0
    };
    let (lp_mixed, lp_full) = (log_probs(&mixed), log_probs(&full));
    assert_eq!(
        lp_mixed.dtype(),
        DType::F32,
        "log-probs are reported in f32"
    );
    let (a, b) = (
        lp_mixed
            .flatten_all()
            .expect("f")
            .to_vec1::<f32>()
            .expect("v"),
        lp_full
            .flatten_all()
            .expect("f")
            .to_vec1::<f32>()
            .expect("v"),
    );
    let num: f32 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    let rel = (num / den).sqrt();
    assert!(rel < 2e-2 && rel > 0.0, "bf16 vs f32 relative error {rel}");

    let loss = lp_mixed.mean_all().expect("mean").neg().expect("neg");
    let grads = loss.backward().expect("backward");
    for (name, var) in mixed.vars() {
        assert_eq!(var.dtype(), DType::F32, "{name}: master");
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient"));
        assert_eq!(g.dtype(), DType::F32, "{name}: gradient");
        let g = g
            .abs()
            .expect("abs")
            .sum_all()
            .expect("s")
            .to_scalar::<f32>()
            .expect("s");
        assert!(g.is_finite() && g > 0.0, "{name}: gradient {g}");
    }
    // One AdamW step of the trainer's optimizer: moments and the update in fp32.
    let spec = acpo::optim::OptimSpec {
        lr: 1e-6,
        lr_schedule: acpo::optim::LrSchedule::Constant,
        warmup_steps: 0,
        grad_clip: 1.0,
        weight_decay: 0.0,
        betas: [0.9, 0.999],
        eps: 1e-8,
    };
    let before: Vec<Vec<f32>> = mixed
        .vars()
        .map(|(_, v)| v.flatten_all().expect("f").to_vec1::<f32>().expect("v"))
        .collect();
    let mut opt = acpo::optim::AdamW::new(&mixed, &spec).expect("adamw");
    let grads = acpo::optim::Gradients::from_store(&mixed, &grads).expect("grads");
    assert!(opt.step(&grads).expect("step").applied);
    let moved = mixed
        .vars()
        .zip(&before)
        .filter(|((_, v), b)| v.flatten_all().expect("f").to_vec1::<f32>().expect("v") != **b)
        .count();
    assert_eq!(
        moved,
        mixed.len(),
        "every fp32 master moved by an lr of 1e-6"
    );
}

/// A left-padded batch of the tiny models: ids, positions, key_valid, the targets of the last
/// 5 positions, and their mask.
fn padded_batch() -> (Tensor, Tensor, Tensor, Tensor) {
    let rows: [&[u32]; 2] = [&[5, 17, 99, 3, 64, 2, 127, 40], &[9, 8, 7, 6, 5]];
    let t = 8;
    let (mut ids, mut pos, mut valid) = (Vec::new(), Vec::new(), Vec::new());
    for r in rows {
        let pad = t - r.len();
        ids.extend(std::iter::repeat_n(0u32, pad).chain(r.iter().copied()));
        pos.extend((0..t as u32).map(|i| i.saturating_sub(pad as u32)));
        valid.extend((0..t).map(|i| u8::from(i >= pad)));
    }
    let dev = Device::Cpu;
    let ids = Tensor::from_vec(ids, (2, t), &dev).expect("ids");
    let targets = ids.narrow(1, 3, 5).expect("targets");
    (
        ids,
        Tensor::from_vec(pos, (2, t), &dev).expect("pos"),
        Tensor::from_vec(valid, (2, t), &dev).expect("valid"),
        targets,
    )
}

/// A loss of every kind of term training uses: the log-probs of the targets and the entropy
/// (at T = 0.8), from the hidden states of positions 2..7.
fn toy_loss(model: &Qwen, hidden: &Tensor, targets: &Tensor) -> Tensor {
    let h = hidden.narrow(1, 2, 5).expect("h");
    let (lp, ent) = model
        .token_log_probs(&h, targets, 0.8, 2, true)
        .expect("log-probs");
    let ent = ent.expect("entropy");
    (lp.mean_all().expect("m") - (ent.mean_all().expect("m") * 0.1).expect("s"))
        .expect("loss")
        .neg()
        .expect("neg")
}

/// The largest |a − b| over the largest |b| (or `floor`, if larger): a difference on the scale
/// of the reference `b`.
pub(crate) fn scaled_max_diff(a: &[f32], b: &[f32], floor: f32) -> f32 {
    let scale = b.iter().fold(floor, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

fn grads_by_name(
    params: &Params,
    store: &candle_core::backprop::GradStore,
) -> Vec<(String, Vec<f32>)> {
    params
        .vars()
        .map(|(name, v)| {
            let g = store
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no gradient"));
            (
                name.clone(),
                g.flatten_all().expect("f").to_vec1::<f32>().expect("v"),
            )
        })
        .collect()
}

#[test]
fn flash_attention_and_vocabulary_chunks_give_the_composed_model_and_its_gradients() {
    use acpo::model::qwen::Kernels;
    for name in ["tiny-qwen3", "tiny-qwen2"] {
        let (cfg, params) = load(name);
        let (ids, pos, valid, targets) = padded_batch();
        let run = |kernels: Kernels| {
            let model = Qwen::new(&cfg, &params, false)
                .expect("model")
                .with_kernels(kernels);
            let (hidden, _) = model
                .forward_hidden(&ids, &pos, &valid, None)
                .expect("forward");
            let loss = toy_loss(&model, &hidden, &targets);
            let store = loss.backward().expect("backward");
            (
                loss.to_scalar::<f32>().expect("s"),
                grads_by_name(&params, &store),
            )
        };
        let (l0, g0) = run(Kernels::composed());
        for kernels in [
            Kernels {
                flash_attention: true,
                vocab_chunk: None,
                decode_chain: false,
                layer_by_hand: false,
                flash_backward: acpo::fused::FlashBackward::Pair,
            },
            Kernels {
                flash_attention: false,
                vocab_chunk: Some(37),
                decode_chain: false,
                layer_by_hand: false,
                flash_backward: acpo::fused::FlashBackward::Pair,
            },
            Kernels {
                flash_attention: true,
                vocab_chunk: Some(64),
                decode_chain: false,
                layer_by_hand: false,
                flash_backward: acpo::fused::FlashBackward::Pair,
            },
        ] {
            let (l1, g1) = run(kernels);
            assert!(
                (l1 - l0).abs() <= 1e-5 * l0.abs(),
                "{name} {kernels:?}: loss {l1} vs {l0}"
            );
            for ((n, a), (_, b)) in g1.iter().zip(&g0) {
                let d = scaled_max_diff(a, b, 1e-6);
                assert!(
                    d < 1e-4,
                    "{name} {kernels:?}: gradient of {n} differs by {d}"
                );
            }
        }
    }
}

/// [`toy_loss`] through a checkpointed backward: the loss and every gradient in one store.
fn checkpointed_toy_loss(
    model: &Qwen,
    (ids, pos, valid): (&Tensor, &Tensor, &Tensor),
    targets: &Tensor,
) -> (f32, candle_core::backprop::GradStore) {
    let mut store = candle_core::backprop::GradStore::default();
    let loss = model
        .checkpointed_backward(
            ids,
            pos,
            valid,
            |m, h| -> acpo::model::Result<_> {
                let loss = toy_loss(m, h, targets);
                Ok((loss.clone(), loss.to_scalar::<f32>()?))
            },
            |layer| Ok(store.extend(layer)?),
        )
        .expect("checkpointed");
    (loss, store)
}

#[test]
fn gradient_checkpointing_gives_the_plain_gradients_bit_for_bit() {
    use acpo::model::qwen::Kernels;
    for name in ["tiny-qwen3", "tiny-qwen2"] {
        let (cfg, params) = load(name);
        let (ids, pos, valid, targets) = padded_batch();
        for kernels in [
            Kernels::composed(),
            Kernels {
                flash_attention: true,
                vocab_chunk: Some(64),
                decode_chain: false,
                layer_by_hand: false,
                flash_backward: acpo::fused::FlashBackward::Pair,
            },
        ] {
            let model = Qwen::new(&cfg, &params, false)
                .expect("model")
                .with_kernels(kernels);
            let (hidden, _) = model
                .forward_hidden(&ids, &pos, &valid, None)
                .expect("forward");
            let plain_loss = toy_loss(&model, &hidden, &targets);
            let plain = grads_by_name(&params, &plain_loss.backward().expect("backward"));
            let (loss, store) = checkpointed_toy_loss(&model, (&ids, &pos, &valid), &targets);
            assert_eq!(loss, plain_loss.to_scalar::<f32>().expect("s"));
            for ((n, a), (_, b)) in grads_by_name(&params, &store).iter().zip(&plain) {
                let d = a
                    .iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f32::max);
                assert!(
                    a == b,
                    "{name} {kernels:?}: the gradient of {n} differs by {d}"
                );
            }
        }
    }
}

/// Two decoder layers at the Qwen3-1.7B layer's shapes (hidden 2,048, 16 query and 8 key heads
/// of 128, MLP 6,144, tied embeddings) over a vocabulary of 128, for `max_positions`.
pub(crate) fn qwen3_1_7b_layers(max_positions: usize) -> QwenConfig {
    let json = format!(
        r#"{{"model_type": "qwen3", "vocab_size": 128, "hidden_size": 2048,
        "intermediate_size": 6144, "num_hidden_layers": 2, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": true, "max_position_embeddings": {max_positions}}}"#
    );
    QwenConfig::from_json(&json, Path::new("config.json")).expect("config")
}

/// Each decoder layer's backward written out by hand (issue #59 item 2, `qwen/by_hand.rs`)
/// against candle's autograd over the composed layer, its oracle: the same loss, and every
/// parameter's gradient to f32 round-off, composed and flash attention (the CPU twin), with
/// Qwen3's q/k norms at the Qwen3-1.7B layer's shapes (hidden 2,048, 16 query and 8 key heads of
/// 128, MLP 6,144; two layers, a small vocabulary) and with Qwen2's biases (the tiny fixture).
#[test]
fn the_layer_backward_by_hand_gives_autograds_gradients() {
    use acpo::model::qwen::Kernels;
    let cfg = qwen3_1_7b_layers(256);
    let params = init::random_params(&cfg, 5, DType::F32, &Device::Cpu).expect("weights");
    let (tiny_cfg, tiny_params) = load("tiny-qwen2");
    // f64 masters computing in f32: each weight the layer reads is a cast of its master
    // (`Params::weight`, as bf16 on the GPU), whose gradient goes back through the cast
    let tiny_f64 = Params::load_dir(&fixtures().join("tiny-qwen2"), DType::F64, &Device::Cpu)
        .expect("weights")
        .with_compute(DType::F32);
    let (ids, pos, valid, targets) = padded_batch();
    for (name, cfg, params) in [
        ("qwen3-1.7b layers", &cfg, &params),
        ("tiny-qwen2", &tiny_cfg, &tiny_params),
        ("tiny-qwen2 f64 masters", &tiny_cfg, &tiny_f64),
    ] {
        for flash in [false, true] {
            let run = |by_hand: bool| {
                let kernels = Kernels {
                    flash_attention: flash,
                    layer_by_hand: by_hand,
                    flash_backward: acpo::fused::FlashBackward::Pair,
                    ..Kernels::composed()
                };
                let model = Qwen::new(cfg, params, false)
                    .expect("model")
                    .with_kernels(kernels);
                let (loss, store) = checkpointed_toy_loss(&model, (&ids, &pos, &valid), &targets);
                let grads: Vec<(String, Vec<f32>)> = params
                    .vars()
                    .map(|(n, v)| {
                        let g = store
                            .get(v.as_tensor())
                            .unwrap_or_else(|| panic!("{name}: {n} has no gradient"));
                        assert_eq!(g.dtype(), v.dtype(), "{name}: {n}'s gradient");
                        let g = g.to_dtype(DType::F32).and_then(|g| g.flatten_all());
                        (n.clone(), g.and_then(|g| g.to_vec1()).expect("host"))
                    })
                    .collect();
                (loss, grads)
            };
            let (l0, g0) = run(false);
            let (l1, g1) = run(true);
            assert_eq!(l1, l0, "{name} flash={flash}: the forward is the same");
            let mut layer_params = 0;
            for ((n, a), (_, b)) in g1.iter().zip(&g0) {
                layer_params += usize::from(n.contains(".layers."));
                let d = scaled_max_diff(a, b, 1e-12);
                assert!(
                    d < 2e-4,
                    "{name} flash={flash}: the gradient of {n} differs by {d} of its largest"
                );
            }
            // every weight of both layers was compared (9 or 11 per layer)
            assert!(
                layer_params >= 18,
                "{name}: {layer_params} layer parameters"
            );
        }
    }
}

#[test]
fn continuous_batching_gives_every_prompt_its_solo_completion() {
    // Sequences end at different steps (a tenth of the vocabulary ends them), so waiting prompts
    // join a batch that is part-way through decoding, in whichever slot came free.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompts: Vec<Vec<u32>> = vec![
        vec![5, 17, 99],
        vec![1, 2, 3, 4, 5, 6, 7],
        vec![42],
        vec![9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
        vec![3, 1, 4, 1, 5],
        vec![100, 101],
        vec![7, 7, 7, 7],
    ];
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [3, 2, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 12,
    };
    let eos: Vec<u32> = (0..13).collect();
    let request = |slots: Option<usize>| {
        let r = SampleRequest::new(p).eos(eos.clone());
        match slots {
            Some(n) => r.max_batch(n),
            None => r,
        }
    };
    let solo: Vec<_> = (0..prompts.len())
        .map(|i| {
            rollout::generate(&model, &prompts[i..=i], &keys[i..=i], &request(None)).expect("solo")
                [0]
            .clone()
        })
        .collect();
    let lengths: Vec<usize> = solo.iter().map(|c| c.tokens.len()).collect();
    assert!(
        lengths.iter().any(|&l| l < 12) && lengths.iter().any(|&l| l > 1),
        "the test needs sequences of different lengths: {lengths:?}"
    );
    // Per-prompt length limits (the long-tail benchmark's): honoured, and each completion is
    // the solo one cut at its limit.
    let limits = vec![1, 12, 3, 7, 2, 12, 5];
    let limited = rollout::generate(
        &model,
        &prompts,
        &keys,
        &request(Some(3)).limits(limits.clone()),
    )
    .expect("limited");
    for (i, c) in limited.iter().enumerate() {
        let n = solo[i].tokens.len().min(limits[i]);
        assert_eq!(
            c.tokens,
            solo[i].tokens[..n],
            "prompt {i}: limit {}",
            limits[i]
        );
    }
    // Prompts join in finished rows' places where they fit within the batch's columns, and by
    // a copy of the batch's cache where they do not or fewer prompts wait than rows finished
    // (the copies also count the finished rows leaving at the end, and the columns no row reads
    // dropped to make room).
    let (mut in_place, mut moved) = (0, 0);
    for slots in [1, 2, 3, 7] {
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let batched =
            rollout::generate(&model, &prompts, &keys, &request(Some(slots)).stats(&stats))
                .expect("batched");
        let s = *stats.lock().unwrap();
        assert!(
            s.joined_in_place <= prompts.len() - slots,
            "{slots} slots: {} joined in place",
            s.joined_in_place
        );
        (in_place, moved) = (in_place + s.joined_in_place, moved + s.cache_moves);
        for (i, (b, s)) in batched.iter().zip(&solo).enumerate() {
            assert_eq!(
                b.tokens, s.tokens,
                "{slots} slots, prompt {i}: tokens differ"
            );
            assert_eq!(b.finish, s.finish, "{slots} slots, prompt {i}");
            assert!(
                max_abs_diff(&b.log_probs, &s.log_probs) < 1e-5,
                "{slots} slots, prompt {i}: log-probs differ"
            );
        }
    }
    assert!(
        in_place > 0 && moved > 0,
        "both ways of joining should run: {in_place} prompts joined in place, {moved} moves"
    );
}

#[test]
fn a_long_call_of_continuous_batching_keeps_its_cache_as_wide_as_one_sequence() {
    // Each step appends a column for the whole batch, so over a call of many prompts the
    // batch's history grows far past any sequence's; the columns no row reads are dropped,
    // so the buffers stay within 9/8 of a prompt and its response after each drop, and a
    // merge widens them by at most a prompt until the next, where doubling them when full
    // (before) made them as wide as the whole call (142 columns at 2 slots).
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompts: Vec<Vec<u32>> = (0..40u32)
        .map(|i| (0..1 + i % 6).map(|j| 20 + (7 * i + j) % 90).collect())
        .collect();
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [5, 1, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 10,
    };
    let eos: Vec<u32> = (0..13).collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap() + p.max_new_tokens;
    let solo: Vec<_> = (0..prompts.len())
        .map(|i| {
            let r = SampleRequest::new(p).eos(eos.clone());
            rollout::generate(&model, &prompts[i..=i], &keys[i..=i], &r).expect("solo")[0].clone()
        })
        .collect();
    for slots in [2, 3, 5] {
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let r = SampleRequest::new(p)
            .eos(eos.clone())
            .max_batch(slots)
            .stats(&stats);
        let out = rollout::generate(&model, &prompts, &keys, &r).expect("batched");
        let s = *stats.lock().unwrap();
        assert!(
            s.decode_steps > 2 * longest,
            "{slots} slots: the call should outlast a sequence: {} steps",
            s.decode_steps
        );
        assert!(s.front_drops > 0, "{slots} slots: no drop");
        assert!(
            s.widest_cache <= longest + longest / 8 + 6,
            "{slots} slots: buffers of {} columns for sequences of at most {longest}",
            s.widest_cache
        );
        for (i, (b, s)) in out.iter().zip(&solo).enumerate() {
            assert_eq!(
                b.tokens, s.tokens,
                "{slots} slots, prompt {i}: tokens differ"
            );
        }
    }
}

#[test]
fn a_long_prompt_joins_in_place_when_the_cache_makes_room_in_the_same_step() {
    // A schedule (no EOS, per-prompt limits, 2 slots, 10 new tokens: buffers of 11 columns)
    // where the step whose cache is full is also the step a 12-token prompt joins in place: the
    // columns dropped to make room must leave the joiner's 12 columns in the batch. Row 0 runs
    // prompt 0 (10 tokens), then prompt 3 from step 10; row 1 prompt 1 (1 token), then prompt 2
    // (10 tokens, to step 11), then prompt 4, the long one.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompts: Vec<Vec<u32>> = vec![vec![5], vec![6], vec![7], vec![8], vec![9; 12]];
    let limits = vec![10, 1, 10, 5, 3];
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [8, 1, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 10,
    };
    let solo: Vec<_> = (0..prompts.len())
        .map(|i| {
            let r = SampleRequest::new(p).limits(vec![limits[i]]);
            rollout::generate(&model, &prompts[i..=i], &keys[i..=i], &r).expect("solo")[0].clone()
        })
        .collect();
    let stats = std::sync::Mutex::new(rollout::GenStats::default());
    let out = rollout::generate(
        &model,
        &prompts,
        &keys,
        &SampleRequest::new(p)
            .limits(limits.clone())
            .max_batch(2)
            .stats(&stats),
    )
    .expect("the long prompt joins");
    let s = *stats.lock().unwrap();
    assert_eq!(s.joined_in_place, 3, "prompts 2, 3 and 4 join in place");
    for (i, (b, s)) in out.iter().zip(&solo).enumerate() {
        assert_eq!(b.tokens, s.tokens, "prompt {i}: tokens differ");
    }
}

#[test]
fn schedules_that_merge_into_a_full_cache_or_prefill_every_step_give_solo_completions() {
    // No EOS, per-prompt limits, 2 slots. (a) 4 new tokens: prompt 3 (6 tokens, longer than
    // the batch's history) is merged at the step that fills the cache, and the next step must
    // make room. (b) Every limit 1: each draw finishes every row, and each turn prefills a
    // new batch.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 4,
    };
    let cases: [(Vec<Vec<u32>>, Vec<usize>); 2] = [
        (
            vec![vec![5], vec![6], vec![7], vec![8; 6]],
            vec![2, 4, 4, 2],
        ),
        (
            vec![vec![5], vec![6, 7], vec![8], vec![9, 10, 11]],
            vec![1; 4],
        ),
    ];
    for (case, (prompts, limits)) in cases.iter().enumerate() {
        let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [8, 2, i, 0]).collect();
        let solo: Vec<_> = (0..prompts.len())
            .map(|i| {
                let r = SampleRequest::new(p).limits(vec![limits[i]]);
                rollout::generate(&model, &prompts[i..=i], &keys[i..=i], &r).expect("solo")[0]
                    .clone()
            })
            .collect();
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let r = SampleRequest::new(p)
            .limits(limits.clone())
            .max_batch(2)
            .stats(&stats);
        let out = rollout::generate(&model, prompts, &keys, &r).expect("batched");
        for (i, (b, s)) in out.iter().zip(&solo).enumerate() {
            assert_eq!(b.tokens, s.tokens, "case {case}, prompt {i}: tokens differ");
            assert!(
                max_abs_diff(&b.log_probs, &s.log_probs) < 1e-5,
                "case {case}, prompt {i}: log-probs differ"
            );
        }
        let s = *stats.lock().unwrap();
        if case == 0 {
            assert!(
                s.front_drops > 0,
                "case 0: the step after the merge makes room"
            );
        } else {
            assert_eq!(
                (s.joined_in_place, s.cache_moves),
                (0, 0),
                "case 1: fresh batches"
            );
        }
    }
}

#[test]
fn the_dense_caches_dropped_columns_keep_the_paged_caches_bits_on_the_cpu() {
    // Over a long call the dense engine drops the columns no row reads any more, in whole
    // groups of 8; the paged engine's gathered view drops none. The same bits either way.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let prompts: Vec<Vec<u32>> = (0..30u32)
        .map(|i| (0..1 + i % 7).map(|j| 20 + (11 * i + 3 * j) % 90).collect())
        .collect();
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [6, 3, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 24,
    };
    let eos: Vec<u32> = (0..13).collect();
    for slots in [2, 4] {
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let dense = SampleRequest::new(p)
            .eos(eos.clone())
            .max_batch(slots)
            .stats(&stats);
        let dense = rollout::generate(&model, &prompts, &keys, &dense).expect("dense");
        let s = *stats.lock().unwrap();
        let drops = s.front_drops;
        // columns were dropped: the rows are narrower than the steps the batch ran
        assert!(
            drops > 0 && s.widest_cache < s.decode_steps,
            "{slots} slots: the test needs drops ({drops}; rows of {} columns, {} steps)",
            s.widest_cache,
            s.decode_steps
        );
        let paged = SampleRequest::new(p)
            .eos(eos.clone())
            .max_batch(slots)
            .paged(rollout::PagedOptions::default());
        let paged = rollout::generate(&model, &prompts, &keys, &paged).expect("paged");
        assert_same_completions(
            &paged,
            &dense,
            0.0,
            &format!("{slots} slots, {drops} drops"),
        );
    }
}

#[test]
fn the_kv_cache_is_allocated_once_and_written_in_place() {
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let seq: Vec<u32> = vec![5, 17, 99, 3, 64, 2, 127, 40, 8, 1];
    let dev = Device::Cpu;
    let row = |ids: &[u32], start: u32| {
        (
            Tensor::new(ids, &dev)
                .expect("ids")
                .unsqueeze(0)
                .expect("b"),
            Tensor::new(
                (start..start + ids.len() as u32)
                    .collect::<Vec<_>>()
                    .as_slice(),
                &dev,
            )
            .expect("pos")
            .unsqueeze(0)
            .expect("b"),
        )
    };
    let (ids, pos) = row(&seq[..4], 0);
    let reserve = acpo::model::qwen::KvCache::with_reserve(6);
    let valid = |n: usize| Tensor::ones((1, n), DType::U8, &dev).expect("valid");
    let (_, mut cache) = model
        .forward_hidden(&ids, &pos, &valid(4), Some(&reserve))
        .expect("prefill");
    assert_eq!((cache.len(), cache.capacity()), (4, 10));
    let mut last = Vec::new();
    for j in 4..seq.len() {
        let (ids, pos) = row(&seq[j..=j], j as u32);
        let (h, next) = model
            .forward_hidden(&ids, &pos, &valid(j + 1), Some(&cache))
            .expect("decode");
        assert_eq!(
            (next.len(), next.capacity()),
            (j + 1, 10),
            "no reallocation"
        );
        cache = next;
        last = h.flatten_all().expect("f").to_vec1::<f32>().expect("v");
    }
    // Past the reserve, the cache moves into a larger buffer and goes on.
    let (ids, pos) = row(&[3], 10);
    let (_, grown) = model
        .forward_hidden(&ids, &pos, &valid(11), Some(&cache))
        .expect("grow");
    assert!(grown.len() == 11 && grown.capacity() >= 11);
    // The in-place decode equals one forward over the whole sequence.
    let full = forward_full(&model, std::slice::from_ref(&seq));
    let h = full.dim(2).expect("h");
    let want = full
        .narrow(1, seq.len() - 1, 1)
        .expect("n")
        .flatten_all()
        .expect("f")
        .to_vec1::<f32>()
        .expect("v");
    assert_eq!(want.len(), h);
    assert!(max_abs_diff(&last, &want) < 1e-4);
}

/// The backward from a known output gradient (each checkpointed layer's, the embedding's and the
/// tied lm_head's, one layer's attention in `acpo bench attention`) is seeded with that gradient
/// (`fused::backward_seed`), not through a `sum_all` to differentiate, which candle 0.11's CUDA
/// backend reduces in one block (tens of ms a step at the paper's shapes).
#[test]
fn no_backward_from_an_output_gradient_differentiates_a_sum_all() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let body = |file: &str, from: &str| -> String {
        let text = std::fs::read_to_string(root.join(file)).expect("source");
        let start = text
            .find(from)
            .unwrap_or_else(|| panic!("{from} in {file}"));
        // up to the next item at the same depth (a line opening with `    pub fn`, `pub fn` or `}`
        // at column 0 ends an fn in an impl or at top level)
        let rest = &text[start..];
        let end = rest[from.len()..]
            .find("\n    pub fn ")
            .or_else(|| rest[from.len()..].find("\n}\n"))
            .map_or(rest.len(), |e| e + from.len());
        rest[..end].to_string()
    };
    for (file, from) in [
        ("src/model/qwen.rs", "pub fn checkpointed_backward"),
        ("src/perf/attention.rs", "pub fn bench_attention"),
    ] {
        let code = body(file, from);
        assert!(
            code.contains("backward_seed"),
            "{file}: {from} is not seeded with backward_seed"
        );
        let sums: Vec<&str> = code.lines().filter(|l| l.contains("sum_all")).collect();
        assert!(
            sums.is_empty(),
            "{file}: {from} still sums to seed: {sums:?}"
        );
    }
}

/// Prompts, their sample keys, the sampling and the end-of-sequence tokens.
type SamplingCase = (Vec<Vec<u32>>, Vec<[u64; 4]>, SamplingParams, Vec<u32>);

/// Ragged prompts, a tenth of the vocabulary ending a sequence: sequences finish at different
/// steps, so prompts join a batch part-way through decoding.
fn paged_case() -> SamplingCase {
    let prompts: Vec<Vec<u32>> = vec![
        vec![5, 17, 99],
        vec![1, 2, 3, 4, 5, 6, 7],
        vec![42],
        vec![9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
        vec![3, 1, 4, 1, 5],
        vec![100, 101],
        vec![7, 7, 7, 7],
    ];
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [5, 1, i, 0]).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 40,
    };
    (prompts, keys, p, (0..13).collect())
}

/// The dense engine's completions of `prompts`, every one at once, stopping at `eos`: the
/// reference the paged engine's tests compare with.
fn dense_completions(
    model: &Qwen,
    prompts: &[Vec<u32>],
    keys: &[[u64; 4]],
    p: SamplingParams,
    eos: &[u32],
) -> Vec<rollout::Completion> {
    let request = SampleRequest::new(p).eos(eos.to_vec());
    rollout::generate(model, prompts, keys, &request).expect("dense")
}

/// Tokens, finish reasons and log-probabilities (these to `tol`; 0: the same bits).
fn assert_same_completions(
    got: &[rollout::Completion],
    want: &[rollout::Completion],
    tol: f32,
    what: &str,
) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "{what}, prompt {i}: tokens differ");
        assert_eq!(g.finish, w.finish, "{what}, prompt {i}");
        if tol == 0.0 {
            let bits = |c: &rollout::Completion| -> Vec<u32> {
                c.log_probs.iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(bits(g), bits(w), "{what}, prompt {i}: log-prob bits differ");
        } else {
            assert!(
                max_abs_diff(&g.log_probs, &w.log_probs) < tol,
                "{what}, prompt {i}: log-probs differ"
            );
        }
    }
}

#[test]
fn the_paged_cache_gives_the_dense_caches_bits_on_the_cpu() {
    // The CPU reads the paged cache through a gathered view in the dense engine's layout: the
    // same numbers, bit for bit, whatever the batch (every prompt at once, or slots that fill
    // as sequences finish, prompts joining without moving the others' keys).
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let (prompts, keys, p, eos) = paged_case();
    for slots in [None, Some(1), Some(3), Some(5)] {
        let request = |paged: bool| {
            let mut r = SampleRequest::new(p).eos(eos.clone());
            if let Some(n) = slots {
                r = r.max_batch(n);
            }
            if paged {
                r = r.paged(rollout::PagedOptions::default());
            }
            r
        };
        let dense = rollout::generate(&model, &prompts, &keys, &request(false)).expect("dense");
        let lengths: Vec<usize> = dense.iter().map(|c| c.tokens.len()).collect();
        assert!(
            lengths.iter().any(|&l| l > 33) && lengths.iter().any(|&l| l < 10),
            "the test needs sequences crossing a block boundary and short ones: {lengths:?}"
        );
        let paged = rollout::generate(&model, &prompts, &keys, &request(true)).expect("paged");
        assert_same_completions(&paged, &dense, 0.0, &format!("{slots:?} slots"));
    }
}

#[test]
fn the_paged_cache_read_through_block_tables_gives_the_dense_tokens() {
    // The decode kernel's path (its CPU twin): attention over each row's own keys through its
    // block table, no gathered view.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let (prompts, keys, p, eos) = paged_case();
    let dense = dense_completions(&model, &prompts, &keys, p, &eos);
    for slots in [None, Some(2)] {
        let mut r = SampleRequest::new(p)
            .eos(eos.clone())
            .paged(rollout::PagedOptions {
                tables: Some(true),
                ..Default::default()
            });
        if let Some(n) = slots {
            r = r.max_batch(n);
        }
        let paged = rollout::generate(&model, &prompts, &keys, &r).expect("paged");
        assert_same_completions(&paged, &dense, 1e-5, &format!("tables, {slots:?} slots"));
    }
}

#[test]
fn a_group_of_responses_shares_its_prompts_prefill_and_blocks() {
    // GRPO's n responses of a prompt: one prefill per distinct prompt, every response its own
    // key; the completions are the dense engine's, which prefills each copy.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let (distinct, _, p, eos) = paged_case();
    let distinct = &distinct[..3];
    let n = 4;
    let prompts: Vec<Vec<u32>> = distinct
        .iter()
        .flat_map(|q| std::iter::repeat_n(q.clone(), n))
        .collect();
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64)
        .map(|i| [9, 0, i / n as u64, i % n as u64])
        .collect();
    let dense = dense_completions(&model, &prompts, &keys, p, &eos);
    let first: Vec<&[u32]> = dense.iter().map(|c| &c.tokens[..1]).collect();
    assert!(
        first.chunks(n).any(|g| g.iter().any(|t| *t != g[0])),
        "the responses of a group should differ from their first token: {first:?}"
    );
    let distinct_tokens: usize = distinct.iter().map(Vec::len).sum();
    // every prompt at once, and a batch of 5 that splits groups across admissions
    for slots in [None, Some(5)] {
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let mut r = SampleRequest::new(p)
            .eos(eos.clone())
            .paged(rollout::PagedOptions::default())
            .stats(&stats);
        if let Some(s) = slots {
            r = r.max_batch(s);
        }
        let paged = rollout::generate(&model, &prompts, &keys, &r).expect("paged");
        assert_same_completions(&paged, &dense, 1e-5, &format!("groups, {slots:?} slots"));
        let prefilled = stats.lock().unwrap().prefill_tokens;
        assert_eq!(
            prefilled, distinct_tokens,
            "{slots:?} slots: one prefill per prompt"
        );
        // Without sharing, every copy is prefilled.
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let mut r = SampleRequest::new(p)
            .eos(eos.clone())
            .paged(rollout::PagedOptions {
                share_prompts: false,
                ..Default::default()
            })
            .stats(&stats);
        if let Some(s) = slots {
            r = r.max_batch(s);
        }
        let unshared = rollout::generate(&model, &prompts, &keys, &r).expect("unshared");
        assert_same_completions(&unshared, &dense, 1e-5, "groups, unshared");
        assert_eq!(stats.lock().unwrap().prefill_tokens, n * distinct_tokens);
    }
}

/// The GPU's FP8 cache, E4M3 bytes (`U8`), run on the CPU through the kernels' twins: the dense
/// cache, the paged pool read through a gathered view and through the block tables, responses
/// of a group sharing (and copying on write) their prompt's byte blocks, and a pool small
/// enough that sequences wait for blocks. Each gives, bit for bit, what the same engine gives
/// with the E4M3 values held in f32 (`Fp8E4m3Values`, what the CPU keeps for `Fp8E4m3`), and
/// the tokens of the dense engine (not always its bits: a masked key weighs ~1e-38 on the CPU,
/// and E4M3's short significands make rounding ties it can break; kernels/NOTES.md, version 13).
#[test]
fn an_fp8_cache_of_bytes_samples_what_its_values_sample_dense_and_paged() {
    use acpo::model::qwen::KvCacheDtype;
    let (cfg, params) = load("tiny-qwen3");
    let model = |dtype| {
        Qwen::new(&cfg, &params, true)
            .expect("model")
            .with_kv_cache(dtype)
            .expect("cpu")
    };
    let (bytes, values) = (
        model(KvCacheDtype::Fp8E4m3Bytes),
        model(KvCacheDtype::Fp8E4m3Values),
    );
    assert_eq!(
        (bytes.kv_storage_dtype(), values.kv_storage_dtype()),
        (DType::U8, DType::F32)
    );
    assert_eq!(bytes.kv_elem_bytes(), 1);
    let (mut prompts, _, p, eos) = paged_case();
    prompts.extend(std::iter::repeat_n(vec![8, 6, 4, 2], 3));
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [6, 2, i, 0]).collect();
    let want = dense_completions(&values, &prompts, &keys, p, &eos);
    let plain = dense_completions(&model(KvCacheDtype::Model), &prompts, &keys, p, &eos);
    assert!(
        want.iter()
            .zip(&plain)
            .any(|(a, b)| a.log_probs != b.log_probs),
        "the FP8 cache should change the log-probs"
    );
    let dense = dense_completions(&bytes, &prompts, &keys, p, &eos);
    assert_same_completions(&dense, &want, 0.0, "dense bytes");
    // the pool, when given, in blocks: the same count for a byte pool and one of f32 values
    let request = |m: &Qwen, tables: bool, share_prompts: bool, blocks: Option<usize>| {
        let per = acpo::model::paged::PagedKv::block_bytes(&cfg, m.kv_elem_bytes(), 32);
        SampleRequest::new(p)
            .eos(eos.clone())
            .paged(rollout::PagedOptions {
                tables: Some(tables),
                share_prompts,
                budget: blocks.map(|n| (n * per) as u128),
                ..Default::default()
            })
    };
    for (tables, share_prompts, blocks) in [
        (false, false, None),
        (false, true, None),
        (true, true, None),
        (true, true, Some(7)),
    ] {
        let what = format!("paged, tables {tables}, shared {share_prompts}, {blocks:?} blocks");
        let sample = |m: &Qwen| {
            rollout::generate(
                m,
                &prompts,
                &keys,
                &request(m, tables, share_prompts, blocks),
            )
            .expect(&what)
        };
        let got = sample(&bytes);
        assert_same_completions(
            &got,
            &sample(&values),
            0.0,
            &format!("{what}: bytes, values"),
        );
        assert_same_completions(&got, &want, 1e-5, &format!("{what}: paged, dense"));
    }
}

#[test]
fn both_engines_run_the_decode_steps_the_roofline_charges() {
    // `acpo bench generate --long-tail` charges a decode roofline the weights once a step and
    // each row's cache at each of its steps: the dense engine's steps are
    // `perf::continuous_reads`' schedule (prompts of one length, the lengths their limits), and
    // both engines count the steps and positions they run (`GenStats::decode_steps`,
    // `decode_positions`), which the paged row's roofline takes.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let (prompt_len, batch) = (6usize, 9usize);
    let prompts: Vec<Vec<u32>> = (0..batch as u32)
        .map(|i| {
            (0..prompt_len as u32)
                .map(|j| (i * 7 + j * 3) % 100 + 1)
                .collect()
        })
        .collect();
    let keys: Vec<[u64; 4]> = (0..batch as u64).map(|i| [3, 3, i, 0]).collect();
    let limits = acpo::perf::long_tail_lengths(batch, 12);
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: 12,
    };
    for slots in [1usize, 2, 4, batch] {
        let want = acpo::perf::continuous_reads(&limits, prompt_len, slots, 0.0, 0.0).steps;
        for paged in [false, true] {
            let stats = std::sync::Mutex::new(rollout::GenStats::default());
            let mut r = SampleRequest::new(p)
                .limits(limits.clone())
                .max_batch(slots)
                .stats(&stats);
            if paged {
                r = r.paged(rollout::PagedOptions::default());
            }
            let out = rollout::generate(&model, &prompts, &keys, &r).expect("generate");
            let lens: Vec<usize> = out.iter().map(|c| c.tokens.len()).collect();
            assert_eq!(lens, limits, "no EOS: every row runs to its limit");
            let s = *stats.lock().unwrap();
            assert_eq!(s.decode_steps, want, "{slots} slots, paged {paged}");
            // and read each row's own positions at each of its steps, whatever the schedule
            let positions = acpo::perf::kv_reads(&limits, prompt_len, 1.0);
            assert_eq!(
                s.decode_positions as f64, positions,
                "{slots} slots, paged {paged}"
            );
            // the waits for the draws are part of the decode time, so the host's share is a
            // share (on the CPU nothing is queued: the host's is nearly all of it)
            assert!(
                (0.0..=s.decode_seconds).contains(&s.decode_wait_seconds),
                "{slots} slots, paged {paged}: waited {} of {} s",
                s.decode_wait_seconds,
                s.decode_seconds
            );
            let share = s.host_share().expect("decode time");
            assert!((0.0..=1.0).contains(&share), "{share}");
        }
    }
}

#[test]
fn the_paged_prefill_goes_in_groups_under_its_token_budget() {
    // Joining prompts are prefilled in consecutive groups of at most `prefill_tokens` padded
    // positions (a longer prompt alone): the completions are still the dense engine's, and no
    // prefill call is wider than the budget allows.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let (mut prompts, _, p, eos) = paged_case();
    // A GRPO-like pair of identical prompts: shared prompts are prefilled once either way.
    prompts.push(prompts[1].clone());
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [5, 2, i, 0]).collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let dense = dense_completions(&model, &prompts, &keys, p, &eos);
    for slots in [None, Some(3)] {
        for (budget, widest) in [
            (None, None),
            (Some(1), Some(longest)),
            (Some(12), Some(12)),
            (Some(30), Some(30)),
        ] {
            for tables in [false, true] {
                let what = format!("budget {budget:?}, {slots:?} slots, tables {tables}");
                let stats = std::sync::Mutex::new(rollout::GenStats::default());
                let mut r = SampleRequest::new(p)
                    .eos(eos.clone())
                    .paged(rollout::PagedOptions {
                        prefill_tokens: budget,
                        tables: Some(tables),
                        ..Default::default()
                    })
                    .stats(&stats);
                if let Some(s) = slots {
                    r = r.max_batch(s);
                }
                let paged = rollout::generate(&model, &prompts, &keys, &r).expect(&what);
                assert_same_completions(&paged, &dense, 1e-5, &what);
                let s = *stats.lock().unwrap();
                let distinct: usize = prompts[..prompts.len() - 1].iter().map(Vec::len).sum();
                assert_eq!(s.prefill_tokens, distinct, "{what}: one prefill a prompt");
                match widest {
                    Some(w) => assert!(s.widest_prefill <= w, "{what}: {}", s.widest_prefill),
                    // Unbounded and every prompt at once: one call of all of them, padded.
                    None if slots.is_none() => {
                        assert_eq!(s.widest_prefill, (prompts.len() - 1) * longest, "{what}")
                    }
                    None => {}
                }
            }
        }
    }
}

#[test]
fn a_small_pool_admits_by_real_lengths_and_too_small_a_pool_is_an_error() {
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let (prompts, keys, p, eos) = paged_case();
    let dense = dense_completions(&model, &prompts, &keys, p, &eos);
    let block = acpo::model::paged::PagedKv::block_bytes(&cfg, 4, 32) as u128;
    // Six blocks (and the scratch one) for seven prompts, some of which grow past a block: not
    // all of them fit at once, so prompts join as finished sequences free their blocks, and
    // every completion is still its prompt's.
    let small = SampleRequest::new(p)
        .eos(eos.clone())
        .paged(rollout::PagedOptions {
            budget: Some(7 * block),
            ..Default::default()
        });
    let paged = rollout::generate(&model, &prompts, &keys, &small).expect("a small pool");
    assert_same_completions(&paged, &dense, 1e-5, "a pool of 6 blocks");
    // One usable block: the longest sequence cannot grow past it, and says so.
    let tiny = SampleRequest::new(p)
        .eos(eos.clone())
        .paged(rollout::PagedOptions {
            budget: Some(2 * block),
            ..Default::default()
        });
    let err = rollout::generate(&model, &prompts, &keys, &tiny).expect_err("too small");
    assert!(
        matches!(
            err,
            acpo::model::ModelError::Paged(acpo::model::paged::PagedError::Exhausted { .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("KV cache pool is exhausted"),
        "{err}"
    );
}

/// `n` prompts of `len` tokens (the ones at `i` and `i + groups` identical when `groups < n`).
fn long_prompts(n: usize, len: usize, groups: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..len)
                .map(|t| ((i % groups) * 31 + t * 7 + 20) as u32 % 100 + 14)
                .collect()
        })
        .collect()
}

#[test]
fn sequences_outgrowing_a_small_pool_are_preempted_and_decoded_again_to_the_same_tokens() {
    // Admission keeps one block of room a row; rows that all run to their limit outgrow the
    // pool part-way through decoding, and the latest admitted give their blocks back and
    // start again from their prompts: the completions are still the dense engine's.
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let block = acpo::model::paged::PagedKv::block_bytes(&cfg, 4, 32) as u128;
    // (prompts, prompt length, distinct prompts, max new tokens, usable blocks, max batch)
    let cases = [
        (3, 32, 3, 80, 10, None),
        (8, 10, 8, 100, 20, None),
        (8, 10, 2, 100, 14, None),
        (6, 20, 6, 90, 12, Some(4)),
    ];
    for (n, len, groups, max_new, blocks, slots) in cases {
        let what = format!("{n} prompts of {len}, {max_new} new, {blocks} blocks, {slots:?}");
        let prompts = long_prompts(n, len, groups);
        let keys: Vec<[u64; 4]> = (0..n as u64).map(|i| [3, 7, i, 0]).collect();
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: max_new,
        };
        // No end of sequence: every row grows to its limit.
        let dense =
            rollout::generate(&model, &prompts, &keys, &SampleRequest::new(p)).expect("dense");
        assert!(dense.iter().all(|c| c.tokens.len() == max_new), "{what}");
        let per_row = (len + max_new).div_ceil(32);
        assert!(per_row >= 3, "{what}: rows should need 3 blocks or more");
        let at_once = n
            .min(slots.unwrap_or(n))
            .min(blocks / (len.div_ceil(32) + 1));
        assert!(
            at_once * per_row > blocks && per_row <= blocks,
            "{what}: the rows admitted at once should outgrow the pool, one alone fit"
        );
        for tables in [false, true] {
            let mut r = SampleRequest::new(p).paged(rollout::PagedOptions {
                budget: Some((blocks as u128 + 1) * block),
                tables: Some(tables),
                ..Default::default()
            });
            if let Some(s) = slots {
                r = r.max_batch(s);
            }
            let paged = rollout::generate(&model, &prompts, &keys, &r)
                .unwrap_or_else(|e| panic!("{what}, tables {tables}: {e}"));
            assert_same_completions(&paged, &dense, 1e-5, &format!("{what}, tables {tables}"));
        }
    }
}

#[test]
fn a_first_prompt_larger_than_the_pool_is_the_exhausted_error() {
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let block = acpo::model::paged::PagedKv::block_bytes(&cfg, 4, 32) as u128;
    let (_, keys, p, eos) = paged_case();
    // One usable block; the first prompt fills two.
    let prompts = long_prompts(2, 40, 2);
    let r = SampleRequest::new(p).eos(eos).paged(rollout::PagedOptions {
        budget: Some(2 * block),
        ..Default::default()
    });
    let err = rollout::generate(&model, &prompts, &keys[..2], &r).expect_err("too small");
    assert!(
        matches!(
            err,
            acpo::model::ModelError::Paged(acpo::model::paged::PagedError::Exhausted {
                free: 1,
                total: 1,
                block: 32,
                ..
            })
        ),
        "{err}"
    );
}

/// Whether `candidate`, a gradient computed in bf16, is as close to `truth` (the same gradient
/// computed in f32) as `reference` (another bf16 computation of it, the oracle's) is: within
/// twice the reference's own error, plus one bf16 step of the largest element, where the
/// reference is within 10 % of the truth's largest (else no judgement: an error). Two bf16
/// computations that round in other orders can differ from each other by more than either
/// differs from f32 (on the CPU at the Qwen3-1.7B layer's shapes, the backward by hand and
/// autograd differ by up to 4.5 % of a q-norm's largest gradient, while each is within 4 % of
/// f32's and the hand's error is 0.56–1.43× autograd's), so a fixed bound between them fails
/// for no bug; a wrong formula errs by far more than twice. The errors, or a message.
pub(crate) fn bf16_as_close_as(
    candidate: &[f32],
    reference: &[f32],
    truth: &[f32],
) -> Result<(f32, f32), String> {
    let (e_cand, e_ref) = (
        scaled_max_diff(candidate, truth, 1e-12),
        scaled_max_diff(reference, truth, 1e-12),
    );
    // the reference itself within bf16's reach of the truth (a wrong truth, or a broken
    // oracle, errs by far more: then nothing here could judge the candidate)
    if e_ref >= 0.1 {
        return Err(format!(
            "not judged: the reference is {e_ref:.3e} of the largest from f32's"
        ));
    }
    if e_cand <= 2.0 * e_ref + 2f32.powi(-8) {
        Ok((e_cand, e_ref))
    } else {
        Err(format!(
            "{e_cand:.3e} of the largest from f32's, where the reference is {e_ref:.3e} from it"
        ))
    }
}

/// [`the_layer_backward_by_hand_gives_autograds_gradients`] in bf16 (f32 masters, as a GPU
/// trains), at the Qwen3-1.7B layer's shapes and on the tiny Qwen3: every gradient by hand as
/// close to the f32 step's as autograd's in bf16 is ([`bf16_as_close_as`]), composed and flash
/// attention (its CPU twin). tests/it/cuda.rs holds the GPU's step to the same rule.
#[test]
fn the_layer_backward_by_hand_in_bf16_is_as_close_to_f32_as_autograd() {
    use acpo::model::qwen::Kernels;
    let cfg = qwen3_1_7b_layers(256);
    let (tiny_cfg, _) = load("tiny-qwen3");
    let (ids, pos, valid, targets) = padded_batch();
    for (name, cfg) in [("qwen3-1.7b layers", &cfg), ("tiny-qwen3", &tiny_cfg)] {
        let masters = init::random_params(cfg, 5, DType::F32, &Device::Cpu).expect("weights");
        for flash in [false, true] {
            let run = |by_hand: bool, compute: DType| {
                let params = masters.clone().with_compute(compute);
                let kernels = Kernels {
                    flash_attention: flash,
                    layer_by_hand: by_hand,
                    flash_backward: acpo::fused::FlashBackward::Pair,
                    ..Kernels::composed()
                };
                let model = Qwen::new(cfg, &params, false)
                    .expect("model")
                    .with_kernels(kernels);
                let (_, store) = checkpointed_toy_loss(&model, (&ids, &pos, &valid), &targets);
                grads_by_name(&params, &store)
            };
            let truth = run(false, DType::F32);
            let (autograd, by_hand) = (run(false, DType::BF16), run(true, DType::BF16));
            let mut compared = 0;
            for (((n, t), (_, a)), (_, h)) in truth.iter().zip(&autograd).zip(&by_hand) {
                if let Err(e) = bf16_as_close_as(h, a, t) {
                    panic!("{name} flash={flash}: the gradient of {n} by hand is {e}");
                }
                compared += usize::from(n.contains(".layers."));
            }
            assert!(compared >= 18, "{name}: {compared} layer parameters");
        }
    }
}

/// The paged engine's schedule without a model (`rollout::paged_schedule`, what `acpo bench
/// decode-predict` runs at a GPU's pool) is the engine's: on the same prompts (groups of
/// identical ones, prompts across block boundaries), lengths and pool, with and without shared
/// prompts, a batch cap and prefill groups, the decode steps, the positions they read, the most
/// rows at once, the prefilled tokens and the widest prefill are what a run on the CPU counted;
/// pools small enough to preempt rows and to drop the prompts held for waiting responses, as
/// well as one that holds every row. A pool too small for a row's growth is refused where the
/// engine refuses it, with its error.
#[test]
fn the_paged_schedule_counts_what_the_paged_engine_does() {
    let (cfg, params) = load("tiny-qwen3");
    let model = Qwen::new(&cfg, &params, true).expect("model");
    let distinct: Vec<Vec<u32>> = (0..7u32)
        .map(|g| {
            (0..(9 + 11 * g as usize))
                .map(|t| (g * 31 + t as u32) % 60 + 1)
                .collect()
        })
        .collect();
    let groups = [4usize, 1, 3, 2, 4, 1, 2];
    let prompts: Vec<Vec<u32>> = distinct
        .iter()
        .zip(groups)
        .flat_map(|(p, n)| std::iter::repeat_n(p.clone(), n))
        .collect();
    let keys: Vec<[u64; 4]> = (0..prompts.len() as u64).map(|i| [3, 7, i, 0]).collect();
    let max_new = 70;
    // lengths spread over the limit (rows grow past their admission's room, so that small pools
    // preempt), a few past it
    let limits: Vec<usize> = (0..prompts.len()).map(|i| 8 + (i * 37) % 70).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: max_new,
    };
    let per = acpo::model::paged::PagedKv::block_bytes(&cfg, model.kv_elem_bytes(), 32);
    let (mut preempting, mut dropping) = (0, 0);
    for (blocks, share_prompts, max_batch, prefill_tokens) in [
        (200, true, None, None),
        (200, false, None, Some(64)),
        (200, true, Some(5), Some(100)),
        (12, true, None, Some(64)),
        (12, false, None, None),
        (9, true, Some(4), None),
        (7, true, None, None),
        (6, true, Some(1), None),
    ] {
        let opts = rollout::PagedOptions {
            budget: Some((blocks * per) as u128),
            share_prompts,
            prefill_tokens,
            ..Default::default()
        };
        let stats = std::sync::Mutex::new(rollout::GenStats::default());
        let mut r = SampleRequest::new(p)
            .limits(limits.clone())
            .paged(opts)
            .stats(&stats);
        if let Some(n) = max_batch {
            r = r.max_batch(n);
        }
        let what = format!("{blocks} blocks, sharing {share_prompts}, {max_batch:?} rows, prefills of {prefill_tokens:?}");
        rollout::generate(&model, &prompts, &keys, &r).expect(&what);
        let ran = stats.into_inner().expect("stats");
        let limits: Vec<usize> = limits.iter().map(|&l| l.min(max_new)).collect();
        let s = rollout::paged_schedule(&prompts, &limits, max_batch, blocks, &opts).expect(&what);
        assert_eq!(
            (
                s.decode_steps,
                s.decode_positions,
                s.most_rows,
                s.prefill_tokens,
                s.widest_prefill
            ),
            (
                ran.decode_steps,
                ran.decode_positions,
                ran.most_rows,
                ran.prefill_tokens,
                ran.widest_prefill
            ),
            "{what}"
        );
        preempting += usize::from(s.preempted > 0);
        dropping += usize::from(s.held_dropped > 0);
    }
    assert!(preempting >= 2, "the small pools should preempt rows");
    assert!(dropping >= 1, "a small pool should drop the held prompts");
    // Two blocks: a row outgrows its one block; the engine and its schedule both refuse it.
    let opts = rollout::PagedOptions {
        budget: Some((2 * per) as u128),
        ..Default::default()
    };
    let r = SampleRequest::new(p).limits(limits.clone()).paged(opts);
    let ran = rollout::generate(&model, &prompts, &keys, &r).expect_err("too small");
    let limits: Vec<usize> = limits.iter().map(|&l| l.min(max_new)).collect();
    let err = rollout::paged_schedule(&prompts, &limits, None, 2, &opts).expect_err("too small");
    assert!(
        err.to_string().contains("KV cache pool is exhausted"),
        "{err}"
    );
    assert_eq!(err.to_string(), ran.to_string());
}
