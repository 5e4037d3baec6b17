//! `acpo bench attention`: one layer's causal attention alone, forward and forward + backward,
//! flash or composed, beside its FLOP floor.

use std::time::Instant;

use candle_core::{DType, Tensor};

use super::{median_of, peak_flops, Measurement, Result, SpeedOptions, Subject};
use crate::model::qwen::Kernels;

/// The attention of one layer alone: q `(B, H, T, D)`, k and v `(B, KV, T, D)` of the model's
/// shape, causal, no padding. It times the forward and the forward + backward (from a random
/// output gradient, handed to the output directly: [`crate::fused::backward_seed`], so the time
/// is the kernels' and not a reduction's), flash or composed as `shape.kernels` says. The FLOP
/// floor is the causal attention's 4·B·H·T²·D/2 forward and 2.5× that backward (QKᵀ, PV; then dV, dP, dQ,
/// dK) at the device's peak. Median of `repeats` after a warm-up. `tokens` counts B·T;
/// `seconds` is the forward + backward.
pub fn bench_attention(m: &Subject, opts: &SpeedOptions) -> Result<Measurement> {
    let (target, shape) = (&opts.target, &opts.step);
    let cfg = &m.cfg;
    let dev = target.device.clone();
    let (b, t) = (shape.micro_batch, shape.seq_len);
    let (h, kv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    let dtype = crate::model::Precision::inference(target.dtype).compute;
    let kernels = shape.kernels.unwrap_or_else(|| Kernels::for_device(&dev));
    let flash = kernels.flash_attention && crate::fused::flash_applies(&dev, dtype, d);
    crate::model::budget::check(
        &dev,
        attention_bytes(b, t, h, kv, d, dtype.size_in_bytes(), flash),
        || {
            format!(
                "--micro-batch {b} × --seq-len {t} ({} attention of {}: {h} heads of {d})",
                if flash { "flash" } else { "composed" },
                m.name
            )
        },
    )?;
    let rand = |shape: (usize, usize, usize, usize)| -> Result<candle_core::Var> {
        Ok(candle_core::Var::from_tensor(
            &Tensor::randn(0f32, 1.0, shape, &dev)?.to_dtype(dtype)?,
        )?)
    };
    let (q, k, v) = (
        rand((b, h, t, d))?,
        rand((b, kv, t, d))?,
        rand((b, kv, t, d))?,
    );
    let valid = Tensor::ones((b, t), DType::U8, &dev)?;
    let bias = if flash {
        None
    } else {
        Some(crate::model::qwen::attention_bias(&valid, 0, t, dtype)?)
    };
    let scale = 1.0 / (d as f64).sqrt();
    let forward = || -> Result<Tensor> {
        Ok(match &bias {
            None => {
                crate::fused::flash_attention(&q, &k, &v, &valid, 0, scale, kernels.flash_backward)?
            }
            Some(bias) => crate::fused::attention_composed(&q, &k, &v, bias, scale)?,
        })
    };
    let dout = Tensor::randn(0f32, 1.0, (b, h, t, d), &dev)?.to_dtype(dtype)?;
    let time = |backward: bool| -> Result<f64> {
        let start = Instant::now();
        let out = forward()?;
        if backward {
            let grads = crate::fused::backward_seed(&out, &dout)?.backward()?;
            debug_assert!(grads.get(&q).is_some());
        }
        target.sync()?;
        Ok(start.elapsed().as_secs_f64())
    };
    time(true)?;
    let fwd = median_of(opts.repeats, || time(false))?;
    let both = median_of(opts.repeats, || time(true))?;
    let fwd_flops = 4.0 * (b * h * d) as f64 * (t * t) as f64 / 2.0;
    let floor = peak_flops(target).map(|peak| (fwd_flops / peak, 3.5 * fwd_flops / peak));
    Ok(Measurement {
        model: m.name.clone(),
        parameters: 0,
        what: "attention",
        target: target.name(),
        tokens: b * t,
        seconds: both,
        tokens_per_second: (b * t) as f64 / both,
        repeats: opts.repeats,
        shape: Some(format!(
            "{}: {b}×{t}, {h} heads over {kv} KV heads of {d}; forward {fwd:.4} s ({:.3} TFLOP/s), forward + backward {both:.4} s ({:.3} TFLOP/s){}",
            kernel_label(flash, kernels.flash_backward.runs_on(&dev, dtype, d)),
            fwd_flops / fwd / 1e12,
            3.5 * fwd_flops / both / 1e12,
            floor.map_or_else(String::new, |(f, fb)| format!(
                "; floor at peak {f:.4} s / {fb:.4} s"
            )),
        )),
        mfu: peak_flops(target).map(|peak| 3.5 * fwd_flops / both / peak),
        memory: None,
        roofline: None,
        trace: None,
        settings: None,
    })
}

/// Which attention `bench_attention` timed, in its shape's words.
fn kernel_label(flash: bool, backward: crate::fused::FlashBackward) -> &'static str {
    match (flash, backward) {
        (false, _) => "composed",
        (true, crate::fused::FlashBackward::Pair) => "flash",
        (true, crate::fused::FlashBackward::FiveProducts) => "flash, backward in 5 products",
    }
}

/// Bytes the benchmark holds at least, in `elem` bytes per value: q, k, v and the output's
/// gradient (q's shape), their gradients; with flash the backward's f32 dQ sums, without it the
/// composed attention's `(B, H, T, T)` scores and probabilities beside the `(B, 1, T, T)` causal
/// bias. Computed from the flags before anything is allocated.
fn attention_bytes(
    b: usize,
    t: usize,
    h: usize,
    kv: usize,
    d: usize,
    elem: usize,
    flash: bool,
) -> u128 {
    let (b, t, h, kv, d, e) = (
        b as u128,
        t as u128,
        h as u128,
        kv as u128,
        d as u128,
        elem as u128,
    );
    let tensors = 2 * (2 * b * h * t * d + 2 * b * kv * t * d) * e;
    let square = if flash {
        // the backward's transient f32 dQ sums, which the 5-product backward needs (the
        // pair's δ and statistics are less)
        4 * b * h * t * d
    } else {
        (2 * h + 1) * b * t * t * e
    };
    tensors + square
}
