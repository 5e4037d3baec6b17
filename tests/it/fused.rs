//! The fused CPU kernels (src/fused.rs) against the same math composed from candle's basic ops:
//! values and gradients, on shapes that hit both the serial and the row-parallel paths and
//! widths that are not multiples of the SIMD lane count.

use acpo::algo::token;
use acpo::fused;
use candle_core::{DType, Device, Tensor, Var};

fn randn(seed: u64, shape: &[usize], scale: f32) -> Tensor {
    let mut rng = acpo::rng::SplitMix64::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.next_normal() as f32 * scale).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0.0, f32::max)
}

/// A tensor's elements as f64 (row-major).
fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// Value and gradients (w.r.t. `inputs`) of Σ f(inputs) ⊙ probe, for a fixed random probe.
fn value_and_grads(inputs: &[Tensor], f: &dyn Fn(&[Tensor]) -> Tensor) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&ts);
    let probe = randn(99, y.dims(), 1.0);
    let loss = (&y * &probe).unwrap().sum_all().unwrap();
    let g = loss.backward().unwrap();
    let grads = ts
        .iter()
        .map(|t| g.get(t).expect("every input gets a gradient").clone())
        .collect();
    (y, grads)
}

fn assert_same(
    what: &str,
    inputs: &[Tensor],
    fused_f: &dyn Fn(&[Tensor]) -> Tensor,
    composed_f: &dyn Fn(&[Tensor]) -> Tensor,
    tol: f32,
) {
    let (y1, g1) = value_and_grads(inputs, fused_f);
    let (y2, g2) = value_and_grads(inputs, composed_f);
    let d = max_rel_diff(&y1, &y2);
    assert!(d < tol, "{what}: values differ by {d}");
    for (i, (a, b)) in g1.iter().zip(&g2).enumerate() {
        let d = max_rel_diff(a, b);
        assert!(d < tol, "{what}: gradient of input {i} differs by {d}");
    }
}

#[test]
fn fused_attention_probabilities_match_the_composed_ones_with_gradients() {
    // Scores (B, KV, rep, T, S) and a (B, 1, T, S) causal + padding mask: (2, 1, 3, 5, 37)
    // runs serially; (4, 2, 4, 64, 300) (614k elements) row-parallel.
    for (seed, [b, kv, rep, t, s]) in [(1u64, [2, 1, 3, 5, 37]), (2, [4, 2, 4, 64, 300])] {
        let scores = randn(seed, &[b, kv, rep, t, s], 3.0);
        let valid: Vec<u8> = (0..b * s).map(|i| u8::from(i % 11 != 4)).collect();
        let valid = Tensor::from_vec(valid, (b, s), &Device::Cpu).unwrap();
        let bias = acpo::model::qwen::attention_bias(&valid, s - t, t, DType::F32).unwrap();
        assert_same(
            "attention softmax",
            &[scores],
            &|x| fused::attention_probs(&x[0], &bias, 0.125).unwrap(),
            &|x| fused::attention_probs_composed(&x[0], &bias, 0.125).unwrap(),
            1e-5,
        );
    }
}

/// RoPE from tokens first `(B, T, H, D)` to heads first in one pass (what the model runs since
/// issue #44): its values and its input's gradient are bit for bit those of the path it
/// replaced, the transposed copy rotated in place, so the CPU's numbers did not move; and the
/// composed reference's to rounding. The larger shape runs row-parallel.
#[test]
fn rope_into_heads_first_is_rope_of_the_transposed_copy_bit_for_bit() {
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.into_iter().map(f32::to_bits).collect()
    };
    for (seed, [b, t, h, d]) in [
        (21u64, [1, 1, 1, 2]),
        (22, [2, 17, 3, 16]),
        (23, [2, 64, 8, 128]),
    ] {
        let x = randn(seed, &[b, t, h, d], 1.0);
        let angles = randn(seed + 1, &[b, 1, t, d / 2], 2.0);
        let emb = Tensor::cat(&[&angles, &angles], 3).unwrap();
        let (cos, sin) = (emb.cos().unwrap(), emb.sin().unwrap());
        let heads = |x: &[Tensor]| fused::rope_heads(&x[0], &cos, &sin).unwrap();
        let before = |x: &[Tensor]| {
            let xt = x[0].transpose(1, 2).unwrap().contiguous().unwrap();
            fused::rope(&xt, &cos, &sin).unwrap()
        };
        let (y1, g1) = value_and_grads(std::slice::from_ref(&x), &heads);
        let (y2, g2) = value_and_grads(std::slice::from_ref(&x), &before);
        assert_eq!(y1.dims(), [b, h, t, d]);
        assert!(
            bits(&y1) == bits(&y2),
            "rope_heads {b}x{t}x{h}x{d}: values moved"
        );
        assert!(
            bits(&g1[0]) == bits(&g2[0]),
            "rope_heads {b}x{t}x{h}x{d}: gradient moved"
        );
        assert_same(
            "rope_heads",
            &[x],
            &heads,
            &|x| {
                let xt = x[0].transpose(1, 2).unwrap();
                fused::rope_composed(&xt, &cos, &sin).unwrap()
            },
            1e-5,
        );
    }
}

#[test]
fn rope_into_tokens_first_is_rope_then_the_transposed_copy_and_undoes_rope_heads() {
    for (seed, [b, h, t, d]) in [
        (31u64, [1, 1, 1, 2]),
        (32, [2, 3, 17, 16]),
        (33, [2, 8, 64, 128]),
    ] {
        let x = randn(seed, &[b, h, t, d], 1.0);
        let angles = randn(seed + 1, &[b, 1, t, d / 2], 2.0);
        let emb = Tensor::cat(&[&angles, &angles], 3).unwrap();
        let (cos, sin) = (emb.cos().unwrap(), emb.sin().unwrap());
        let got = fused::rope_tokens_first(&x, &cos, &sin).unwrap();
        assert_eq!(got.dims(), [b, t, h, d]);
        let want = fused::rope(&x, &cos, &sin)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        assert_eq!(bits(&got), bits(&want), "{b}x{h}x{t}x{d}: values moved");
        // the composed path (f64 takes it) agrees
        let x64 = x.to_dtype(DType::F64).unwrap();
        let (c64, s64) = (
            cos.to_dtype(DType::F64).unwrap(),
            sin.to_dtype(DType::F64).unwrap(),
        );
        let composed = fused::rope_tokens_first(&x64, &c64, &s64).unwrap();
        assert!(max_rel_diff(&composed.to_dtype(DType::F32).unwrap(), &got) < 1e-5);
        // with −sin, the inverse of the rotation into heads first
        let back = fused::rope_tokens_first(
            &fused::rope_heads(&got, &cos, &sin).unwrap(),
            &cos,
            &sin.neg().unwrap(),
        )
        .unwrap();
        assert!(
            max_rel_diff(&back, &got) < 1e-5,
            "{b}x{h}x{t}x{d}: not undone"
        );
    }
}

#[test]
fn fused_rope_and_swiglu_match_the_composed_ones_with_gradients() {
    for (seed, [b, h, t, d]) in [(11u64, [2, 3, 5, 8]), (12, [8, 12, 64, 64])] {
        let x = randn(seed, &[b, h, t, d], 1.0);
        let angles = randn(seed + 1, &[b, 1, t, d / 2], 2.0);
        let emb = Tensor::cat(&[&angles, &angles], 3).unwrap();
        let (cos, sin) = (emb.cos().unwrap(), emb.sin().unwrap());
        assert_same(
            "rope",
            &[x],
            &|x| fused::rope(&x[0], &cos, &sin).unwrap(),
            &|x| fused::rope_composed(&x[0], &cos, &sin).unwrap(),
            1e-5,
        );
        let g = randn(seed + 2, &[b, t, 3 * d], 3.0);
        let u = randn(seed + 3, &[b, t, 3 * d], 1.0);
        assert_same(
            "swiglu",
            &[g, u],
            &|x| fused::swiglu(&x[0], &x[1]).unwrap(),
            &|x| fused::swiglu_composed(&x[0], &x[1]).unwrap(),
            1e-5,
        );
    }
}

#[test]
fn fused_rms_norm_matches_the_composed_one_with_gradients_for_x_and_w() {
    for (seed, shape) in [(3u64, vec![2, 5, 19]), (4, vec![8, 128, 96])] {
        let n = *shape.last().unwrap();
        let x = randn(seed, &shape, 2.0);
        let w = (randn(seed + 10, &[n], 0.3) + 1.0).unwrap();
        assert_same(
            "rms_norm",
            &[x, w],
            &|t| fused::rms_norm(&t[0], &t[1], 1e-6).unwrap(),
            &|t| fused::rms_norm_composed(&t[0], &t[1], 1e-6).unwrap(),
            1e-5,
        );
    }
}

#[test]
fn fused_token_log_probs_match_the_composed_ones_with_gradients() {
    for (seed, (b, t, v)) in [(5u64, (2, 3, 11)), (6, (4, 40, 1031))] {
        let z = randn(seed, &[b, t, v], 4.0);
        let mut rng = acpo::rng::SplitMix64::new(seed);
        let tok: Vec<u32> = (0..b * t)
            .map(|_| (rng.next_u64() % v as u64) as u32)
            .collect();
        let tok = Tensor::from_vec(tok, (b, t), &Device::Cpu).unwrap();
        for temperature in [1.0, 0.7] {
            assert_same(
                "token log-probs",
                std::slice::from_ref(&z),
                &|x| token::log_probs(&x[0], &tok, temperature).unwrap(),
                &|x| token::log_probs_composed(&x[0], &tok, temperature).unwrap(),
                1e-5,
            );
        }
    }
    // A token outside the vocabulary is an error, not a read out of bounds.
    let z = randn(7, &[1, 2, 5], 1.0);
    let bad = Tensor::from_vec(vec![1u32, 5], (1, 2), &Device::Cpu).unwrap();
    let err = token::log_probs(&z, &bad, 1.0).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    // More targets than rows of logits is an error too, not a read past the logits (the CPU
    // twin indexed rows by target; CUDA's kernel would have read another buffer).
    let three = Tensor::from_vec(vec![1u32, 2, 3], (1, 3), &Device::Cpu).unwrap();
    let err = token::log_probs(&z, &three, 1.0).unwrap_err().to_string();
    assert!(
        err.contains("not one row of the vocabulary a target"),
        "{err}"
    );
}

#[test]
fn small_row_products_match_gemm_with_gradients() {
    // k = 77 and 768 (a tail after the 8-wide lanes and none); m from 1 to 16 (the 4-row
    // blocks and the leftover rows); n = 600 × 768 crosses the parallel threshold.
    for (m, k, n) in [
        (1, 77, 5),
        (3, 77, 33),
        (4, 768, 600),
        (9, 768, 600),
        (16, 64, 40),
    ] {
        let x = randn(m as u64, &[m, k], 1.0);
        let w = randn(100 + n as u64, &[n, k], 0.1);
        assert_same(
            &format!("linear m={m} k={k} n={n}"),
            &[x, w],
            &|t| {
                fused::linear_small_m(&t[0], &t[1])
                    .unwrap()
                    .expect("applies to small m on CPU f32")
            },
            &|t| t[0].matmul(&t[1].t().unwrap()).unwrap(),
            1e-5,
        );
    }
    // Large m and other dtypes go to the general product.
    let x = randn(1, &[17, 8], 1.0);
    let w = randn(2, &[4, 8], 1.0);
    assert!(fused::linear_small_m(&x, &w).unwrap().is_none());
    let x64 = x.narrow(0, 0, 2).unwrap().to_dtype(DType::F64).unwrap();
    let w64 = w.to_dtype(DType::F64).unwrap();
    assert!(fused::linear_small_m(&x64, &w64).unwrap().is_none());
}

#[test]
fn in_a_one_thread_pool_the_kernels_give_bit_identical_results() {
    // `reproduce --jobs N` runs side by side with a pool of one thread, where the kernels take
    // their serial path; row by row, it must give bit-identical values to the parallel one.
    let scores = randn(21, &[4, 2, 4, 64, 300], 3.0);
    let valid = Tensor::ones((4, 300), DType::U8, &Device::Cpu).unwrap();
    let bias = acpo::model::qwen::attention_bias(&valid, 236, 64, DType::F32).unwrap();
    let x = randn(22, &[8, 2048], 1.0);
    let w = randn(23, &[600, 2048], 0.1);
    let run = || {
        (
            fused::attention_probs(&scores, &bias, 0.125).unwrap(),
            fused::linear_small_m(&x, &w).unwrap().unwrap(),
        )
    };
    let (p_default, y_default) = run();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (p_one, y_one) = pool.install(run);
    assert_eq!(max_rel_diff(&p_one, &p_default), 0.0);
    assert_eq!(max_rel_diff(&y_one, &y_default), 0.0);
}

#[test]
fn pair_packed_weights_give_the_plain_kernels_numbers_bit_for_bit() {
    // Odd n (a last unpaired row), k with and without a tail, m over the 4-row tiles and the
    // leftover rows, and n·k past the parallel threshold.
    for (m, k, n) in [
        (1, 77, 5),
        (3, 77, 33),
        (4, 768, 601),
        (7, 768, 600),
        (16, 64, 41),
        (2, 5, 3),
    ] {
        let x = randn(m as u64, &[m, k], 1.0);
        let w = randn(200 + n as u64, &[n, k], 0.1);
        let packed = fused::pack_pairs(&w).unwrap().expect("CPU f32");
        assert_eq!(packed.dims(), w.dims());
        assert!(
            max_rel_diff(&packed, &w) > 0.0 || n < 2 || k < 8,
            "layout changed"
        );
        let plain = fused::linear_small_m(&x, &w).unwrap().unwrap();
        let fast = fused::linear_small_m_packed(&x, &packed).unwrap().unwrap();
        assert_eq!(max_rel_diff(&fast, &plain), 0.0, "packed m={m} k={k} n={n}");
    }
    // Not CPU f32: no packed copy; and a packed product cannot be differentiated.
    let w64 = randn(1, &[4, 8], 1.0).to_dtype(DType::F64).unwrap();
    assert!(fused::pack_pairs(&w64).unwrap().is_none());
    let w = Var::from_tensor(&randn(2, &[4, 8], 1.0)).unwrap();
    let packed = fused::pack_pairs(w.as_tensor()).unwrap().unwrap();
    let x = Var::from_tensor(&randn(3, &[2, 8], 1.0)).unwrap();
    let y = fused::linear_small_m_packed(x.as_tensor(), &packed)
        .unwrap()
        .unwrap();
    let err = y.sum_all().unwrap().backward().expect_err("no backward");
    assert!(err.to_string().contains("no backward"), "{err}");
}

#[test]
fn a_rows_small_product_does_not_depend_on_the_rows_beside_it() {
    // The small-row kernel takes rows in tiles of 8 (where AVX-512VL gives it the registers),
    // then of 4, then one at a time, and walks the width in blocks; a row must get the same
    // bits in any of them, or sampling would depend on the batch a prompt lands in. k = 600
    // is not a multiple of the block width and has a tail; n = 1201 ends on an unpaired row.
    let (k, n) = (600, 1201);
    let x = randn(50, &[16, k], 1.0);
    let w = randn(51, &[n, k], 0.1);
    let packed = fused::pack_pairs(&w).unwrap().unwrap();
    let all = fused::linear_small_m(&x, &w).unwrap().unwrap();
    assert_eq!(
        max_rel_diff(
            &fused::linear_small_m_packed(&x, &packed).unwrap().unwrap(),
            &all
        ),
        0.0
    );
    for (start, m) in [
        (0, 1),
        (5, 1),
        (0, 4),
        (3, 8),
        (8, 8),
        (1, 12),
        (2, 13),
        (0, 16),
    ] {
        let rows = x.narrow(0, start, m).unwrap();
        for y in [
            fused::linear_small_m(&rows, &w).unwrap().unwrap(),
            fused::linear_small_m_packed(&rows, &packed)
                .unwrap()
                .unwrap(),
        ] {
            let want = all.narrow(0, start, m).unwrap();
            assert_eq!(max_rel_diff(&y, &want), 0.0, "rows {start}..{}", start + m);
        }
    }
}

#[test]
fn micro_batches_side_by_side_come_back_in_order_with_the_serial_numbers() {
    // Each item runs a product big enough for the kernels' parallel path when alone.
    let w = randn(31, &[600, 768], 0.1);
    let f = |i: usize| {
        let x = randn(40 + i as u64, &[8, 768], 1.0);
        let y = fused::linear_small_m(&x, &w).unwrap().unwrap();
        (i, y.flatten_all().unwrap().to_vec1::<f32>().unwrap())
    };
    let serial = acpo::parallel::map(5, false, f);
    let side = acpo::parallel::map(5, true, f);
    assert_eq!(
        serial.iter().map(|r| r.0).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(serial, side);
    // Also from a pool of two threads, whatever this machine has.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    assert_eq!(pool.install(|| acpo::parallel::map(5, true, f)), serial);
    assert!(acpo::parallel::map(0, true, f).is_empty());
}

#[test]
fn flash_attention_matches_the_composed_attention_with_gradients() {
    // (b, h, kv, t, past, d, pad): left padding gives query rows that see no key (they average
    // V uniformly in both); past > 0 is a decode step after a cache; d = 128 is the paper's.
    let cases = [
        (1u64, [2, 4, 2, 7, 0, 24, 3]),
        (2, [1, 3, 1, 1, 40, 16, 5]),
        (3, [2, 2, 2, 37, 5, 128, 0]),
        (4, [3, 6, 2, 33, 0, 8, 1]),
    ];
    for (seed, [b, h, kv, t, past, d, pad]) in cases {
        let s = past + t;
        let q = randn(seed, &[b, h, t, d], 1.0);
        let k = randn(seed + 10, &[b, kv, s, d], 1.0);
        let v = randn(seed + 20, &[b, kv, s, d], 1.0);
        // Row 0 is left-padded by `pad` keys; the others are whole, but one key in the middle
        // of row 1 is padding too.
        let valid: Vec<u8> = (0..b * s)
            .map(|i| u8::from(!((i / s == 0 && i % s < pad) || (i / s == 1 && i % s == s / 2))))
            .collect();
        let valid = Tensor::from_vec(valid, (b, s), &Device::Cpu).unwrap();
        let bias = acpo::model::qwen::attention_bias(&valid, past, t, DType::F32).unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        assert!(fused::flash_applies(&Device::Cpu, DType::F32, d));
        // the CPU twin has one backward, whichever the kernels are asked for
        for backward in [
            fused::FlashBackward::Pair,
            fused::FlashBackward::FiveProducts,
        ] {
            assert_same(
                &format!(
                    "flash attention {:?} {backward:?}",
                    [b, h, kv, t, past, d, pad]
                ),
                &[q.clone(), k.clone(), v.clone()],
                &|x| {
                    fused::flash_attention(&x[0], &x[1], &x[2], &valid, past, scale, backward)
                        .unwrap()
                },
                &|x| fused::attention_composed(&x[0], &x[1], &x[2], &bias, scale).unwrap(),
                1e-5,
            );
        }
    }
    assert!(!fused::flash_applies(&Device::Cpu, DType::F32, 256));
    assert!(!fused::flash_applies(&Device::Cpu, DType::BF16, 64));
}

#[test]
fn chunked_vocabulary_log_probs_and_entropy_match_the_full_logits_with_gradients() {
    let (n, hd, v) = (13, 24, 1000);
    let hidden = randn(31, &[n, hd], 1.0);
    let weight = randn(32, &[v, hd], 0.5);
    let mut rng = acpo::rng::SplitMix64::new(33);
    let targets: Vec<u32> = (0..n).map(|_| (rng.next_u64() % v as u64) as u32).collect();
    let targets = Tensor::from_vec(targets, n, &Device::Cpu).unwrap();
    let full = |x: &[Tensor], temperature: f64| {
        let logits = x[0].matmul(&x[1].t().unwrap()).unwrap();
        let lp = token::log_probs_composed(&logits, &targets, temperature).unwrap();
        let ent = token::entropy(&logits, temperature).unwrap();
        Tensor::stack(&[lp, ent], 1).unwrap()
    };
    // Chunks that divide V, that do not, of one column, and wider than V; each chunk's
    // element-wise chain from candle's ops (the CPU path) and as one op each way (the CUDA
    // path's arithmetic, kernels/vocab_chunk.cu, here its CPU twin).
    for (chunk, temperature) in [(250, 1.0), (256, 0.7), (1, 1.3), (4096, 1.0)] {
        for (how, fused_chain) in [("composed", false), ("fused", true)] {
            assert_same(
                &format!("vocabulary chunks of {chunk} at T = {temperature}, {how}"),
                &[hidden.clone(), weight.clone()],
                &|x| {
                    let run = if fused_chain {
                        fused::vocab_log_probs_fused
                    } else {
                        fused::vocab_log_probs
                    };
                    let (lp, ent) = run(&x[0], &x[1], &targets, temperature, chunk).unwrap();
                    Tensor::stack(&[lp, ent], 1).unwrap()
                },
                &|x| full(x, temperature),
                1e-5,
            );
        }
    }
}

/// Where gemm's own depth blocks are fixed (both sides ≤ 64: 512 from the start) or follow the
/// cache (cut into ⌈k/512⌉ equal blocks on a 32 KiB 8-way L1), for a product with a row-major
/// output whose operands are not unit-stride vectors.
fn gemm_depth_blocks(m: usize, k: usize, n: usize) -> Vec<(usize, usize)> {
    let len = if m <= 64 && n <= 64 {
        k.min(512)
    } else {
        k.div_ceil(k.div_ceil(512))
    };
    (0..k)
        .step_by(len.max(1))
        .map(|d| (d, len.min(k - d)))
        .collect()
}

/// `a (m, k) · b (k, n)`, row-major, as gemm's FMA kernel sums each element: a chain of fused
/// multiply-adds over each depth block, the blocks added in order.
fn blocked_product(a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f32> {
    let blocks = gemm_depth_blocks(m, k, n);
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut sum = 0f32;
            for (x, &(d0, len)) in blocks.iter().enumerate() {
                let block =
                    (d0..d0 + len).fold(0f32, |acc, p| a[i * k + p].mul_add(b[p * n + j], acc));
                sum = if x == 0 { block } else { sum + block };
            }
            out[i * n + j] = sum;
        }
    }
    out
}

/// A tensor's values (f32) as bits, in row-major order.
pub(crate) fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

fn row_major(t: &Tensor) -> Vec<f32> {
    t.contiguous()
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Whether gemm runs its FMA kernels here, the ones [`blocked_product`] sums as.
fn gemm_fma(test: &str) -> bool {
    let fma = cfg!(target_arch = "x86_64")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma");
    if !fma {
        crate::skip(
            test,
            format_args!("gemm's FMA kernels need an x86-64 CPU with AVX2 and FMA"),
        );
    }
    fma
}

#[test]
fn matmul_sums_in_fixed_depth_blocks_whatever_the_cache_with_gradients() {
    if !gemm_fma("matmul_sums_in_fixed_depth_blocks_whatever_the_cache_with_gradients") {
        return;
    }
    // (m, k, n): products blocked by the cache (2, 3 and 4 blocks, an uneven last one), small
    // ones with a fixed 512 block, and one depth of a single block; the shapes of a linear
    // layer's weight gradient (k = the tokens of a micro-batch) among them.
    for (m, k, n) in [
        (128, 960, 48),
        (48, 960, 128),
        (96, 1100, 288),
        (65, 1537, 10),
        (70, 513, 70),
        (48, 960, 48),
        (20, 2000, 20),
        (100, 300, 100),
        (960, 48, 128),
        (1100, 96, 288),
    ] {
        let a = randn(50, &[m, k], 1.0);
        let b = randn(51, &[k, n], 1.0);
        let want = blocked_product(&row_major(&a), &row_major(&b), (m, k, n));
        let want: Vec<u32> = want.into_iter().map(f32::to_bits).collect();
        assert_eq!(
            bits(&fused::matmul(&a, &b).unwrap()),
            want,
            "{m}×{k}·{k}×{n}"
        );
        // Through a transposed weight, as a linear layer multiplies: x · wᵀ.
        let w = b.t().unwrap().contiguous().unwrap();
        assert_eq!(
            bits(&fused::matmul(&a, &w.t().unwrap()).unwrap()),
            want,
            "{m}×{k}·({n}×{k})ᵀ"
        );
        // The gradients are products of the same kind: da = g·bᵀ (depth n), db = aᵀ·g (depth m).
        let (va, vb) = (Var::from_tensor(&a).unwrap(), Var::from_tensor(&b).unwrap());
        let g = randn(52, &[m, n], 1.0);
        let y = fused::matmul(va.as_tensor(), vb.as_tensor()).unwrap();
        let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
        let ga = row_major(&g);
        let da = blocked_product(&ga, &row_major(&b.t().unwrap()), (m, n, k));
        let db = blocked_product(&row_major(&a.t().unwrap()), &ga, (k, m, n));
        assert_eq!(
            bits(grads.get(va.as_tensor()).unwrap()),
            da.into_iter().map(f32::to_bits).collect::<Vec<_>>(),
            "da of {m}×{k}·{k}×{n}"
        );
        assert_eq!(
            bits(grads.get(vb.as_tensor()).unwrap()),
            db.into_iter().map(f32::to_bits).collect::<Vec<_>>(),
            "db of {m}×{k}·{k}×{n}"
        );
    }
}

#[test]
fn matmul_is_candles_where_gemm_does_not_block_by_cache_on_any_thread_count() {
    // Products gemm sums the same way on every CPU go to it unchanged: a depth of one block,
    // a value head's column (n = 1) and its weight gradient (m = 1), a few outputs of a deep
    // product against a transposed weight (gemm's horizontal kernel).
    let cases = [
        (randn(60, &[300, 200], 1.0), randn(61, &[200, 90], 1.0)),
        (
            randn(62, &[200, 1000], 1.0),
            randn(63, &[1, 1000], 1.0).t().unwrap(),
        ),
        (randn(64, &[1, 960], 1.0), randn(65, &[960, 96], 1.0)),
        (
            randn(66, &[3, 2000], 1.0),
            randn(67, &[5, 2000], 1.0).t().unwrap(),
        ),
        (
            randn(70, &[100, 2000], 1.0),
            randn(71, &[2, 2000], 1.0).t().unwrap(),
        ),
    ];
    for (a, b) in &cases {
        let want = bits(&a.matmul(b).unwrap());
        assert_eq!(
            bits(&fused::matmul(a, b).unwrap()),
            want,
            "{:?}·{:?}",
            a.dims(),
            b.dims()
        );
    }
    // A product gemm splits over its threads, in pools of 1 to 8: the same bits.
    let (a, b) = (randn(68, &[256, 1500], 1.0), randn(69, &[1500, 192], 1.0));
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let want = one.install(|| bits(&fused::matmul(&a, &b).unwrap()));
    for threads in [2, 3, 4, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        assert_eq!(
            pool.install(|| bits(&fused::matmul(&a, &b).unwrap())),
            want,
            "{threads} threads"
        );
    }
}

/// The decode step's attention (one query per row) gives the composed attention's numbers bit
/// for bit: keys and values read in place from a cache with room beyond them, padding masked,
/// on both sides of gemm's horizontal-kernel threshold (r·s = 256), head sizes that are and are
/// not multiples of 8; shapes gemm sends elsewhere are refused (the caller keeps candle's).
#[test]
fn decode_attention_equals_the_composed_attention_bit_for_bit() {
    let mut seed = 0;
    let shapes = [
        (3, 2, 2, 16),
        (2, 2, 3, 16),
        (2, 1, 4, 12),
        (1, 3, 2, 5),
        (2, 2, 2, 8),
        (2, 2, 3, 12),
        (1, 1, 5, 24),
    ];
    for (b, kv, rep, d) in shapes {
        for s in [3, 7, 8, 41, 64, 85, 86, 100, 128, 129, 200] {
            seed += 1;
            let cap = s + 9;
            let q = randn(seed, &[b, kv * rep, 1, d], 1.0);
            let kbuf = randn(seed + 1000, &[b, kv, cap, d], 1.0);
            let vbuf = randn(seed + 2000, &[b, kv, cap, d], 1.0);
            let (k, v) = (kbuf.narrow(2, 0, s).unwrap(), vbuf.narrow(2, 0, s).unwrap());
            // Left padding: row bi's first bi keys are masked.
            let mask: Vec<f32> = (0..b)
                .flat_map(|bi| (0..s).map(move |j| if j < bi { -1e9 } else { 0.0 }))
                .collect();
            let bias = Tensor::from_vec(mask, (b, 1, 1, s), &Device::Cpu).unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let composed = fused::attention_composed(&q, &k, &v, &bias, scale).unwrap();
            let decoded = fused::attention_decode(&q, &k, &v, &bias, scale)
                .unwrap()
                .expect("applies");
            let bits = |t: &Tensor| -> Vec<u32> {
                let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(
                bits(&decoded),
                bits(&composed),
                "b {b}, kv {kv}, rep {rep}, s {s}, d {d}"
            );
        }
    }
    // One query head per key head, or two keys: gemm's gemv and gevv paths, left to candle.
    let q = randn(1, &[1, 2, 1, 16], 1.0);
    let kv = randn(2, &[1, 2, 5, 16], 1.0);
    let bias = Tensor::zeros((1, 1, 1, 5), DType::F32, &Device::Cpu).unwrap();
    assert!(fused::attention_decode(&q, &kv, &kv, &bias, 0.25)
        .unwrap()
        .is_none());
    let two = kv.narrow(2, 0, 2).unwrap();
    let bias2 = bias.narrow(3, 0, 2).unwrap();
    let q4 = randn(3, &[1, 4, 1, 16], 1.0);
    assert!(fused::attention_decode(&q4, &two, &two, &bias2, 0.25)
        .unwrap()
        .is_none());
}

/// Floats `first, first + stride, …` (as bit patterns) through `fused::exp_in_place` and
/// through `f32::exp` (the C library's `expf`): the bits that differ, as (input, ours, libm).
fn exp_mismatches(first: u64, stride: u64) -> Vec<(u32, u32, u32)> {
    let mut bad = Vec::new();
    let mut buf = Vec::with_capacity(1 << 16);
    let mut w = first;
    while w <= u32::MAX as u64 {
        buf.clear();
        while buf.len() < 1 << 16 && w <= u32::MAX as u64 {
            buf.push(f32::from_bits(w as u32));
            w += stride;
        }
        let mut ours = buf.clone();
        fused::exp_in_place(&mut ours);
        for (&x, &y) in buf.iter().zip(&ours) {
            let want = x.exp();
            // NaNs compare as NaN (their payloads may differ between paths).
            if y.to_bits() != want.to_bits() && !(y.is_nan() && want.is_nan()) {
                bad.push((x.to_bits(), y.to_bits(), want.to_bits()));
            }
        }
    }
    bad
}

/// The vectorised `expf` gives `f32::exp`'s bits: a sweep over every exponent and sign (one
/// float in 251), the values where glibc's FMA and SSE2 variants differ, the edges of its fast
/// path (|x| near 88, where lanes fall back to the scalar call), zeros, infinities and NaN, and
/// lengths that leave a scalar tail.
#[test]
fn exp_matches_libm_bit_for_bit() {
    assert_eq!(exp_mismatches(7, 251), vec![]);
    // The first eight in one vector (no lane leaves the fast path), the rest with fallbacks.
    let edges: Vec<f32> = [
        0x4202422F_u32,
        0xC27C65D9,
        0x42AFFFFF,
        0xC2AFFFFF,
        0x3F800000,
        0x33800000,
        0xB3800000,
        0x0,
        0x42B00000,
        0xC2B00000,
        0x42B17218,
        0xC2CFF1B5,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0x00000001,
        0x80000001,
        0x41200000,
        0xC1200000,
        0x3DCCCCCD,
    ]
    .iter()
    .map(|&b| f32::from_bits(b))
    .collect();
    for len in [edges.len(), 16, 8, 7, 1] {
        let mut ours = edges[..len].to_vec();
        fused::exp_in_place(&mut ours);
        for (&x, &y) in edges.iter().zip(&ours) {
            let want = x.exp();
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "exp({x:e} = {:#010x}): {:#010x}, libm {:#010x}",
                x.to_bits(),
                y.to_bits(),
                want.to_bits()
            );
        }
    }
}

/// Every one of the 2^32 floats (a minute on two cores): `cargo test --release --test it --
/// --ignored exp_matches_libm_on_every_float`.
#[test]
#[ignore]
fn exp_matches_libm_on_every_float() {
    let bad = exp_mismatches(0, 1);
    assert!(
        bad.is_empty(),
        "{} differ, first {:x?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
}

/// A backward seeded with its output gradient ([`fused::backward_seed`]) gives the gradients of
/// differentiating `(y ⊙ g).sum_all()`, bit for bit (signed zeros of `g` included: both add the
/// gradient into zeros), and its value is ⟨y, g⟩; mismatched operands are an error.
#[test]
fn backward_seed_gives_the_sum_all_gradients_bit_for_bit() {
    let shape = [3, 5, 70];
    let w = Var::from_tensor(&randn(41, &shape, 1.0)).unwrap();
    let b = Var::from_tensor(&randn(42, &[70], 1.0)).unwrap();
    let mut g = randn(43, &shape, 1.0)
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    for (i, x) in g.iter_mut().enumerate() {
        match i % 7 {
            0 => *x = -0.0,
            1 => *x = 0.0,
            _ => {}
        }
    }
    let g = Tensor::from_vec(g, &shape[..], &Device::Cpu).unwrap();
    // y uses w twice and b broadcast, so the gradients add up from several paths.
    let y = || {
        let x = w.as_tensor();
        ((x.exp().unwrap() * x).unwrap().tanh().unwrap() + x.broadcast_add(b.as_tensor())).unwrap()
    };
    let old = (y() * &g).unwrap().sum_all().unwrap();
    let old_grads = old.backward().unwrap();
    let seed = fused::backward_seed(&y(), &g).unwrap();
    assert_eq!(seed.dims(), old.dims());
    let (sv, ov) = (
        seed.to_scalar::<f32>().unwrap(),
        old.to_scalar::<f32>().unwrap(),
    );
    assert!((sv - ov).abs() <= 1e-4 * ov.abs().max(1.0), "{sv} vs {ov}");
    let new_grads = seed.backward().unwrap();
    for v in [&w, &b] {
        let bits = |store: &candle_core::backprop::GradStore| -> Vec<u32> {
            let t = store.get(v.as_tensor()).expect("a gradient");
            let t = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            t.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&new_grads), bits(&old_grads));
    }
    // g is a constant: it gets no gradient, where the sum gave it y.
    assert!(new_grads.get(&g).is_none());
    assert!(fused::backward_seed(&y(), &g.narrow(2, 0, 69).unwrap()).is_err());
    assert!(fused::backward_seed(&y(), &g.to_dtype(DType::F64).unwrap()).is_err());
}

/// The backwards a hand-written layer calls (`model/qwen/by_hand.rs`), against autograd over the
/// composed ops: `rms_norm_backward` and `swiglu_backward` in f32 (the fused one-pass kernels)
/// and in f64 (their formulas, the path of every dtype the kernels do not take).
#[test]
fn rms_norm_and_swiglu_backwards_called_directly_are_autograds() {
    for dtype in [DType::F32, DType::F64] {
        // both sides compute in f32 (HF's RMSNorm; the formulas), in their own orders
        let tol = 1e-5;
        let close = |what: &str, a: &Tensor, b: &Tensor| {
            assert_eq!(a.dtype(), dtype, "{what}: dtype");
            let (a, b) = (f64s(a), f64s(b));
            let scale = b.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
            let d = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
                / scale;
            assert!(d < tol, "{dtype:?} {what}: differs by {d} of its largest");
        };
        let (b, t, n) = (3, 7, 40);
        let x = randn(21, &[b, t, n], 2.0).to_dtype(dtype).unwrap();
        let w = (randn(22, &[n], 0.3) + 1.0)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let dy = randn(23, &[b, t, n], 1.0).to_dtype(dtype).unwrap();
        let (xv, wv) = (Var::from_tensor(&x).unwrap(), Var::from_tensor(&w).unwrap());
        let y = fused::rms_norm_composed(xv.as_tensor(), wv.as_tensor(), 1e-6).unwrap();
        let grads = (y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
        let (dx, dw) = fused::rms_norm_backward(&x, &w, &dy, 1e-6).unwrap();
        close("rms_norm dx", &dx, grads.get(xv.as_tensor()).unwrap());
        close("rms_norm dw", &dw, grads.get(wv.as_tensor()).unwrap());

        let g = randn(24, &[b, t, n], 3.0).to_dtype(dtype).unwrap();
        let u = randn(25, &[b, t, n], 1.0).to_dtype(dtype).unwrap();
        let (gv, uv) = (Var::from_tensor(&g).unwrap(), Var::from_tensor(&u).unwrap());
        let s = fused::swiglu_composed(gv.as_tensor(), uv.as_tensor()).unwrap();
        let grads = (s * &dy).unwrap().sum_all().unwrap().backward().unwrap();
        let (dg, du) = fused::swiglu_backward(&g, &u, &dy).unwrap();
        close("swiglu dgate", &dg, grads.get(gv.as_tensor()).unwrap());
        close("swiglu dup", &du, grads.get(uv.as_tensor()).unwrap());
    }
}

/// The residual stream's gradient in the norm's pass (`rms_norm_backward_add`): in f32 (the
/// fused kernel's twin) the bits of the residual plus the norm's backward, the add the layer by
/// hand made before; in f64 and bf16 (the formula, then candle's add) the same values; the
/// weight gradient the norm's own, in a storage of its own size; a residual of another shape
/// refused.
#[test]
fn the_norms_backward_adds_the_residual_in_its_pass() {
    let (b, t, n) = (3, 7, 40);
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let x = randn(31, &[b, t, n], 2.0).to_dtype(dtype).unwrap();
        let w = (randn(32, &[n], 0.3) + 1.0)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let dy = randn(33, &[b, t, n], 1.0).to_dtype(dtype).unwrap();
        let res = randn(34, &[b, t, n], 1.0).to_dtype(dtype).unwrap();
        let (dx, dw) = fused::rms_norm_backward(&x, &w, &dy, 1e-6).unwrap();
        let (sum, dw2) = fused::rms_norm_backward_add(&x, &w, &dy, &res, 1e-6).unwrap();
        let bits = |t: &Tensor| f64s(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(sum.dtype(), dtype);
        assert_eq!(sum.dims(), x.dims());
        assert_eq!(
            bits(&sum),
            bits(&(&res + &dx).unwrap()),
            "{dtype:?}: dx + residual"
        );
        assert_eq!(bits(&dw2), bits(&dw), "{dtype:?}: dw");
        // the weight's gradient holds n numbers, not the pass's whole output: the layer by hand
        // keeps it in the step's sums, where a view of dx's buffer kept all of dx alive
        for g in [&dw, &dw2] {
            let (storage, _) = g.storage_and_layout();
            let held = match &*storage {
                candle_core::Storage::Cpu(c) => match c {
                    candle_core::CpuStorage::F32(v) => v.len(),
                    candle_core::CpuStorage::F64(v) => v.len(),
                    candle_core::CpuStorage::BF16(v) => v.len(),
                    _ => unreachable!("the test's dtypes"),
                },
                _ => unreachable!("on the CPU"),
            };
            assert_eq!(held, n, "{dtype:?}: dw's storage");
        }
        let wrong = res.narrow(2, 0, n - 1).unwrap();
        assert!(fused::rms_norm_backward_add(&x, &w, &dy, &wrong, 1e-6).is_err());
    }
}

/// The decode chain's composed twin writes the new keys and values where [`fused::KvWrite`]
/// says: into the dense cache's column, or into the rows a paged write index names, the same
/// bits when those rows are that column's (the buffers seen as a pool of rows); the fused
/// kernels are held to this twin on a GPU (tests/it/cuda.rs). And on the CPU the fused op never
/// applies: it writes nothing and says so.
#[test]
fn the_decode_chains_twin_writes_a_column_and_pool_rows_alike() {
    let (b, h, kv, cap, d, col) = (2usize, 4usize, 2usize, 5usize, 16usize, 3usize);
    let q = randn(1, &[b, 1, h, d], 2.0);
    let k = randn(2, &[b, 1, kv, d], 2.0);
    let v = randn(3, &[b, 1, kv, d], 1.0);
    let (qw, kw) = (randn(4, &[d], 1.0), randn(5, &[d], 1.0));
    let angles = randn(6, &[b, 1, 1, d / 2], 3.0);
    let angles = Tensor::cat(&[&angles, &angles], 3).expect("cat");
    let (cos, sin) = (angles.cos().expect("cos"), angles.sin().expect("sin"));
    let norms = fused::QkNorms {
        q: &qw,
        k: &kw,
        eps: 1e-6,
    };
    let caches = || {
        (
            randn(7, &[b, kv, cap, d], 1.0),
            randn(8, &[b, kv, cap, d], 1.0),
        )
    };
    let twin = |caches: (&Tensor, &Tensor), at| {
        fused::qk_norm_rope_cache_composed(&q, &k, &v, Some(norms), &cos, &sin, caches, at)
            .expect("the composed chain")
    };
    let (kc, vc) = caches();
    let q_col = twin((&kc, &vc), fused::KvWrite::Column(col));
    // the same buffers as a pool of rows; row (b·KV + j)'s destination is its column's row
    let (kp, vp) = caches();
    let (kp, vp) = (
        kp.reshape((b * kv * cap, d)).expect("pool"),
        vp.reshape((b * kv * cap, d)).expect("pool"),
    );
    let dest: Vec<u32> = (0..(b * kv) as u32)
        .map(|i| i * cap as u32 + col as u32)
        .collect();
    let index = Tensor::from_slice(&dest, (b * kv, 1), &Device::Cpu)
        .and_then(|t| t.broadcast_as((b * kv, d)))
        .and_then(|t| t.contiguous())
        .expect("index");
    let q_rows = twin((&kp, &vp), fused::KvWrite::PoolRows(&index));
    assert_eq!(bits(&q_col), bits(&q_rows), "q");
    assert_eq!(bits(&kc), bits(&kp), "the k cache");
    assert_eq!(bits(&vc), bits(&vp), "the v cache");
    // the column was written (the caches started equal to a fresh draw)
    assert_ne!(bits(&kc), bits(&caches().0), "nothing was written");
    // on the CPU the fused op does not apply
    let fused_q = fused::qk_norm_rope_cache(
        &packed_qkv(&q, &k, &v),
        (h, kv),
        Some(norms),
        &cos,
        &sin,
        (&kc, &vc),
        fused::KvWrite::Column(col),
    )
    .expect("fused");
    assert!(fused_q.is_none(), "the fused chain ran on the CPU");
    assert!(!fused::qk_chain_applies(&Device::Cpu, DType::F32, d));
}

/// q `(B, 1, H, D)`, k and v `(B, 1, KV, D)` side by side in one row `(B, 1, (H + 2·KV)·D)`, as
/// the product with the stacked weights `[Wq; Wk; Wv]` gives them to the fused decode chain.
pub(crate) fn packed_qkv(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
    let row = |t: &Tensor| t.flatten_from(2).expect("a row of heads");
    Tensor::cat(&[row(q), row(k), row(v)], 2).expect("qkv")
}

/// The rotary tables as the model composed them before its kernel, in candle's ops (an
/// independent reference): `(cos, sin)` `(B, 1, T, D)` in `dtype`.
pub(crate) fn composed_rope_tables(
    positions: &Tensor,
    inv_freq: &Tensor,
    dtype: DType,
) -> (Tensor, Tensor) {
    let inv = inv_freq.reshape((1, 1, ())).unwrap();
    let pos = positions
        .to_dtype(DType::F32)
        .unwrap()
        .unsqueeze(2)
        .unwrap();
    let freqs = pos.broadcast_mul(&inv).unwrap();
    let emb = Tensor::cat(&[&freqs, &freqs], 2).unwrap();
    let table = |t: Tensor| t.to_dtype(dtype).unwrap().unsqueeze(1).unwrap();
    (table(emb.cos().unwrap()), table(emb.sin().unwrap()))
}

/// Positions `(B, T)` (u32) up to `max`, the first 0 and the second `max`, and Qwen3's
/// frequencies at head dim `d` (θ = 1e6), on the CPU.
pub(crate) fn rope_table_inputs(b: usize, t: usize, d: usize, max: u32) -> (Tensor, Tensor) {
    let mut rng = acpo::rng::SplitMix64::new(7);
    let pos: Vec<u32> = (0..b * t)
        .map(|i| match i {
            0 => 0,
            1 => max,
            _ => (rng.next_u64() % (u64::from(max) + 1)) as u32,
        })
        .collect();
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| (1.0 / 1e6f64.powf((2 * i) as f64 / d as f64)) as f32)
        .collect();
    (
        Tensor::from_vec(pos, (b, t), &Device::Cpu).unwrap(),
        Tensor::from_vec(inv, d / 2, &Device::Cpu).unwrap(),
    )
}

#[test]
fn the_rotary_tables_twin_is_the_composed_tables_bit_for_bit() {
    for (b, t, d, max) in [(64, 1, 128, 9_220), (2, 300, 128, 40_960), (3, 5, 16, 7)] {
        let (pos, inv) = rope_table_inputs(b, t, d, max);
        // The model's path on the CPU stays composed: the fused tables are CUDA's.
        assert!(fused::rope_tables(&pos, &inv, DType::F32)
            .unwrap()
            .is_none());
        for dtype in [DType::F32, DType::BF16] {
            let (cos, sin) = composed_rope_tables(&pos, &inv, dtype);
            for (trig, want) in [(fused::Trig::Cos, &cos), (fused::Trig::Sin, &sin)] {
                let got = fused::rope_table(&pos, &inv, dtype, trig).unwrap();
                assert_eq!(got.dims(), &[b, 1, t, d]);
                assert_eq!(got.dtype(), dtype);
                let f32s = |x: &Tensor| bits(&x.to_dtype(DType::F32).unwrap());
                assert_eq!(f32s(&got), f32s(want), "{trig:?} {dtype:?} {b}x{t}x{d}");
            }
        }
    }
    // Bad shapes are refused by name, not indexed past.
    let (pos, inv) = rope_table_inputs(2, 3, 16, 9);
    let err = fused::rope_table(
        &pos.flatten_all().unwrap(),
        &inv,
        DType::F32,
        fused::Trig::Cos,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("acpo-rope-table"), "{err}");
}

/// The E4M3 bytes an FP8 cache holds on a GPU (`fused::to_fp8_bytes`, the CPU twin of
/// `kernels/fp8.cu`) read back (`from_fp8_bytes`) are the values the CPU's FP8 cache keeps
/// (`model::qwen::fp8_e4m3`: candle's CPU cast after a clamp), for every bf16 number; and the
/// bytes are E4M3's: 0x7e at ±448 and beyond, 0x38 for 1, ties to even, the subnormals.
#[test]
fn fp8_bytes_read_back_are_the_cpu_caches_values_for_every_bf16_number() {
    let all: Vec<f32> = (0..=u16::MAX)
        .map(|b| f32::from_bits(u32::from(b) << 16))
        .collect();
    let x = Tensor::from_vec(all.clone(), 1 << 16, &Device::Cpu).expect("f32");
    let bytes = fused::to_fp8_bytes(&x).expect("bytes");
    assert_eq!(bytes.dtype(), DType::U8);
    let back = fused::from_fp8_bytes(&bytes, DType::F32)
        .and_then(|t| t.to_vec1::<f32>())
        .expect("back");
    let kept = acpo::model::qwen::fp8_e4m3(&x)
        .expect("kept")
        .to_vec1::<f32>()
        .expect("kept");
    for ((&v, &a), &b) in all.iter().zip(&back).zip(&kept) {
        assert!(
            a == b || (a.is_nan() && b.is_nan()),
            "{v}: bytes read back {a}, the CPU cache keeps {b}"
        );
    }
    // bf16 reads the same values
    let back16 = fused::from_fp8_bytes(&bytes, DType::BF16)
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.to_vec1::<f32>())
        .expect("bf16");
    assert!(back16
        .iter()
        .zip(&back)
        .all(|(a, b)| a == b || (a.is_nan() && b.is_nan())));
    let byte = fused::fp8_byte;
    assert_eq!(
        [
            byte(448.0),
            byte(-1e6),
            byte(1.0),
            byte(1.0625),
            byte(1.1875)
        ],
        [0x7e, 0xfe, 0x38, 0x38, 0x3a]
    );
    assert_eq!(
        [byte(0.001953125), byte(0.0009765625), byte(0.0029296875)],
        [1, 0, 2]
    );
    assert!((0..=255u8).all(|b| {
        let v = fused::fp8_value(b);
        v.is_nan() || byte(v) == b || v == 0.0
    }));
}

/// A batch's token ids over a vocabulary of `vocab`: one token much more frequent than the others
/// (a row with more positions than the kernel's loads of four, and not a multiple of four),
/// tokens that appear once, and rows no position names.
pub(crate) fn skewed_ids(b: usize, t: usize, vocab: u32) -> Tensor {
    let ids: Vec<u32> = (0..(b * t) as u32)
        .map(|p| match p % 7 {
            0 | 3 | 5 => 2,
            1 => (p * 13) % (vocab / 2),
            _ => (p * 5 + 1) % (vocab / 3),
        })
        .collect();
    Tensor::from_vec(ids, (b, t), &Device::Cpu).unwrap()
}

/// The embedding lookup's backward in one pass (`fused::embedding_backward`) is, in f32, the
/// bits autograd gives the embedding matrix through `index_select`'s backward (`index_add` into
/// the gradient so far), with the tied lm_head's share added first as `checkpointed_backward`
/// seeds it, negative zeros and all; untied, into zeros; candle's padding id `u32::MAX` in no
/// row, as `index_add` skips it. From bf16 inputs, the f32 route on their exact values, in f32.
/// An id past the vocabulary is an error naming its position.
#[test]
fn the_embedding_backward_is_autograds_index_add_bit_for_bit() {
    let (vocab, h) = (61usize, 37usize);
    let mut ids: Vec<u32> = skewed_ids(3, 40, vocab as u32)
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    ids[7] = u32::MAX;
    let ids = Tensor::from_vec(ids, (3, 40), &Device::Cpu).unwrap();
    let rows = fused::TokenRows::of(&ids, vocab).unwrap();
    let g = randn(2, &[3, 40, h], 1.0);
    // the lm_head's share with negative zeros, which `0 + x` makes positive
    let mut lm: Vec<f32> = randn(3, &[vocab, h], 1.0)
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    for x in lm.iter_mut().step_by(5) {
        *x = -0.0;
    }
    let g_lm = Tensor::from_vec(lm, (vocab, h), &Device::Cpu).unwrap();
    // autograd's route: the lookup's index_add into W's gradient so far
    let autograd = |g: &Tensor, g_lm: Option<&Tensor>| {
        let w = Var::from_tensor(&randn(4, &[vocab, h], 1.0)).unwrap();
        let x0 = w
            .as_tensor()
            .index_select(&ids.flatten_all().unwrap(), 0)
            .and_then(|x| x.reshape((3, 40, h)))
            .unwrap();
        let mut tail = fused::backward_seed(&x0, g).unwrap();
        if let Some(g_lm) = g_lm {
            tail = (tail + fused::backward_seed(w.as_tensor(), g_lm).unwrap()).unwrap();
        }
        tail.backward()
            .unwrap()
            .remove(w.as_tensor())
            .expect("W's gradient")
    };
    for tied in [true, false] {
        let base = tied.then_some(&g_lm);
        let got = fused::embedding_backward(&rows, &g, base).unwrap();
        assert_eq!(got.dims(), [vocab, h]);
        assert_eq!(got.dtype(), DType::F32);
        assert_eq!(bits(&got), bits(&autograd(&g, base)), "tied: {tied}");
    }
    // bf16 inputs: the f32 route on their values, not autograd's bf16 adds
    let (g16, lm16) = (
        g.to_dtype(DType::BF16).unwrap(),
        g_lm.to_dtype(DType::BF16).unwrap(),
    );
    let got = fused::embedding_backward(&rows, &g16, Some(&lm16)).unwrap();
    let exact = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    assert_eq!(
        bits(&got),
        bits(&autograd(&exact(&g16), Some(&exact(&lm16))))
    );
    // every row summed in position order, whatever the order of the ids: the host's groups
    let grouped = fused::TokenRows::new(&[4, 1, 4, 0, u32::MAX, 4, 1], 6).unwrap();
    assert_eq!(grouped.starts, [0, 1, 3, 3, 3, 6, 6]);
    assert_eq!(grouped.order, [3, 1, 6, 0, 2, 5]);
    let err = fused::TokenRows::new(&[3, 61, 0], vocab)
        .err()
        .expect("an id past the vocabulary")
        .to_string();
    assert!(err.contains("token id 61 at position 1"), "{err}");
    // mismatched inputs are refused, not cast
    let f64s = g.to_dtype(DType::F64).unwrap();
    assert!(fused::embedding_backward(&rows, &f64s, None).is_err());
    assert!(fused::embedding_backward(&rows, &g, Some(&lm16)).is_err());
    assert!(fused::embedding_backward(&rows, &g.narrow(1, 0, 39).unwrap(), None).is_err());
}
