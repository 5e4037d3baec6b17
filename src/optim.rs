//! AdamW with fp32 moments, global gradient-norm clipping and verl's learning-rate schedule,
//! with its whole state saveable for exact resume.
//!
//! candle-nn's AdamW keeps no saveable state and does not clip, so the trainer has its own.
//! The update is PyTorch's `torch.optim.AdamW` (decoupled weight decay, bias correction) after
//! `torch.nn.utils.clip_grad_norm_` (coefficient max_norm / (‖g‖ + 1e-6), applied when < 1), and
//! the rate follows transformers' `get_constant_schedule_with_warmup` as verl uses it: the t-th
//! update (t = 0, 1, …) uses lr · min(1, t / warmup), so with a warmup the first update is a
//! no-op, exactly as there. A step whose gradient norm is not finite is skipped (verl does the
//! same) and reported, and leaves parameters and moments untouched.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Tensor, Var};

use crate::model::{ModelError, Params, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrSchedule {
    /// Constant after an optional linear warmup (the paper's setting).
    Constant,
}

/// The optimizer of a model, as a manifest sets it (`actor.optim`, `critic.optim`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OptimSpec {
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    pub warmup_steps: usize,
    pub grad_clip: f64,
    pub weight_decay: f64,
    pub betas: [f64; 2],
    pub eps: f64,
}

/// Gradients by parameter name, in f32. A missing entry is a zero gradient.
#[derive(Debug, Clone, Default)]
pub struct Gradients(BTreeMap<String, Tensor>);

impl Gradients {
    /// Collects the gradients of `params` from a backward pass.
    pub fn from_store(
        params: &Params,
        store: &candle_core::backprop::GradStore,
    ) -> Result<Gradients> {
        let mut out = BTreeMap::new();
        for (name, var) in params.vars() {
            if let Some(g) = store.get(var.as_tensor()) {
                out.insert(name.clone(), g.detach().to_dtype(DType::F32)?);
            }
        }
        Ok(Gradients(out))
    }

    pub fn from_map(map: BTreeMap<String, Tensor>) -> Gradients {
        Gradients(map)
    }

    /// Adds the gradients of `params` that `store` holds (a whole backward's, or one layer's of
    /// a checkpointed backward): a parameter's sum is the same whether its gradients arrive
    /// this way, layer by layer, or as a micro-batch's [`Gradients::from_store`] then
    /// [`Gradients::accumulate`], as long as each backward reaches it once.
    pub fn add_store(
        &mut self,
        params: &Params,
        store: &candle_core::backprop::GradStore,
    ) -> Result<()> {
        self.accumulate(Gradients::from_store(params, store)?)
    }

    /// Adds another micro-batch's gradients (accumulation is a sum).
    pub fn accumulate(&mut self, other: Gradients) -> Result<()> {
        for (name, g) in other.0 {
            match self.0.get_mut(&name) {
                Some(acc) => *acc = (&*acc + &g)?,
                None => {
                    self.0.insert(name, g);
                }
            }
        }
        Ok(())
    }

    /// ‖g‖₂ over all parameters (f64 accumulation).
    pub fn global_norm(&self) -> Result<f64> {
        let mut sq = 0f64;
        for g in self.0.values() {
            sq += g
                .sqr()?
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
        }
        Ok(sq.sqrt())
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.0.get(name)
    }
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Gradient norm before clipping (verl's `actor/grad_norm`).
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// False when the norm was not finite and nothing was changed.
    pub applied: bool,
    /// False when the update left a parameter non-finite (NaN or ±∞): the caller must stop
    /// before anything is saved.
    pub params_finite: bool,
}

pub struct AdamW {
    spec: OptimSpec,
    names: Vec<String>,
    vars: Vec<Var>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Updates taken so far (skipped non-finite steps do not count).
    t: u64,
}

impl AdamW {
    pub fn new(params: &Params, spec: &OptimSpec) -> Result<AdamW> {
        let (mut names, mut vars, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (name, var) in params.vars() {
            names.push(name.clone());
            vars.push(var.clone());
            m.push(Tensor::zeros(var.shape(), DType::F32, var.device())?);
            v.push(Tensor::zeros(var.shape(), DType::F32, var.device())?);
        }
        Ok(AdamW {
            spec: *spec,
            names,
            vars,
            m,
            v,
            t: 0,
        })
    }

    /// Updates taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.t
    }

    /// The learning rate of the next update.
    pub fn next_lr(&self) -> f64 {
        let w = self.spec.warmup_steps as u64;
        if self.t < w {
            self.spec.lr * self.t as f64 / w as f64
        } else {
            self.spec.lr
        }
    }

    /// Clips `grads` to the manifest's norm and applies one AdamW update. On CUDA the whole
    /// step is `cuda::step` (kernels/adamw.cu): the norm, the clip and every tensor's update on the device, read
    /// back once; elsewhere (the CPU) tensor by tensor, as every shipped CPU result was made.
    pub fn step(&mut self, grads: &Gradients) -> Result<StepReport> {
        let lr = self.next_lr();
        if let Some(done) = cuda_step(self, grads, lr)? {
            let grad_norm = done.squared_norm.sqrt();
            let applied = grad_norm.is_finite();
            self.t += u64::from(applied);
            return Ok(StepReport {
                grad_norm,
                lr,
                applied,
                params_finite: done.params_finite,
            });
        }
        let norm = grads.global_norm()?;
        if !norm.is_finite() {
            return Ok(StepReport {
                grad_norm: norm,
                lr,
                applied: false,
                params_finite: true,
            });
        }
        let coef = self.spec.grad_clip / (norm + 1e-6);
        let scale = if coef < 1.0 { coef } else { 1.0 };
        let h = self.hyper(scale, lr);
        let mut params_finite = true;
        for i in 0..self.vars.len() {
            let g = grads.get(&self.names[i]);
            let (m, v) = (&self.m[i], &self.v[i]);
            let (p, m, v) = match fused_update(&self.vars[i], g, m, v, &h)? {
                Some(new) => new,
                None => composed_update(&self.vars[i], g, m, v, &h)?,
            };
            // A NaN anywhere makes the sum NaN; an overflow makes it infinite.
            params_finite &= p
                .to_dtype(DType::F32)?
                .sum_all()?
                .to_scalar::<f32>()?
                .is_finite();
            self.vars[i].set(&p)?;
            (self.m[i], self.v[i]) = (m, v);
        }
        self.t += 1;
        Ok(StepReport {
            grad_norm: norm,
            lr,
            applied: true,
            params_finite,
        })
    }

    /// The scalars of the next update at learning rate `lr` and clip scale `scale`.
    fn hyper(&self, scale: f64, lr: f64) -> Hyper {
        let [b1, b2] = self.spec.betas;
        let t = (self.t + 1) as i32;
        Hyper {
            scale,
            b1,
            b2,
            lr,
            weight_decay: self.spec.weight_decay,
            bc1: 1.0 - b1.powi(t),
            bc2: 1.0 - b2.powi(t),
            eps: self.spec.eps,
        }
    }

    /// Writes the moments and the step count (safetensors, atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = std::collections::HashMap::new();
        for (i, name) in self.names.iter().enumerate() {
            tensors.insert(format!("{name}.exp_avg"), self.m[i].clone());
            tensors.insert(format!("{name}.exp_avg_sq"), self.v[i].clone());
        }
        // The step count as two u32 halves: safetensors has no u64 in candle's writer.
        let steps = Tensor::new(
            &[(self.t >> 32) as u32, self.t as u32],
            &candle_core::Device::Cpu,
        )?;
        tensors.insert("__steps".into(), steps);
        crate::atomic::save_safetensors(&tensors, path).map_err(|source| ModelError::Save {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }

    /// Restores the state written by [`AdamW::save`] for the same parameters.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let device = self
            .vars
            .first()
            .map(|v| v.device().clone())
            .unwrap_or(candle_core::Device::Cpu);
        let mut tensors = crate::files::regular(path)
            .map_err(|e| e.to_string())
            .and_then(|()| candle_core::safetensors::load(path, &device).map_err(|e| e.to_string()))
            .map_err(|reason| ModelError::Weights {
                path: path.to_owned(),
                reason,
            })?;
        let missing = |name: &str| ModelError::Weights {
            path: path.to_owned(),
            reason: format!("optimizer state has no `{name}`"),
        };
        for (i, name) in self.names.iter().enumerate() {
            let m = tensors
                .remove(&format!("{name}.exp_avg"))
                .ok_or_else(|| missing(&format!("{name}.exp_avg")))?;
            let v = tensors
                .remove(&format!("{name}.exp_avg_sq"))
                .ok_or_else(|| missing(&format!("{name}.exp_avg_sq")))?;
            if m.dims() != self.vars[i].dims() || v.dims() != self.vars[i].dims() {
                return Err(ModelError::Weights {
                    path: path.to_owned(),
                    reason: format!("optimizer state for `{name}` has the wrong shape"),
                });
            }
            self.m[i] = m;
            self.v[i] = v;
        }
        let steps = tensors
            .remove("__steps")
            .ok_or_else(|| missing("__steps"))?
            .to_device(&candle_core::Device::Cpu)?
            .to_vec1::<u32>()?;
        self.t = ((steps[0] as u64) << 32) | steps[1] as u64;
        Ok(())
    }
}

/// One update's scalars: the clipping scale, AdamW's hyperparameters, the learning rate and
/// the bias corrections 1 − β₁ᵗ, 1 − β₂ᵗ.
struct Hyper {
    scale: f64,
    b1: f64,
    b2: f64,
    lr: f64,
    weight_decay: f64,
    bc1: f64,
    bc2: f64,
    eps: f64,
}

/// A parameter's update from tensor ops (any device and dtype): new (p, m, v), p in its dtype.
fn composed_update(
    var: &Var,
    g: Option<&Tensor>,
    m: &Tensor,
    v: &Tensor,
    h: &Hyper,
) -> Result<(Tensor, Tensor, Tensor)> {
    let g = match g {
        Some(g) => (g * h.scale)?,
        None => Tensor::zeros(var.shape(), DType::F32, var.device())?,
    };
    let m = ((m * h.b1)? + (&g * (1.0 - h.b1))?)?;
    let v = ((v * h.b2)? + (g.sqr()? * (1.0 - h.b2))?)?;
    let p = var.as_tensor().to_dtype(DType::F32)?;
    let p = (p * (1.0 - h.lr * h.weight_decay))?;
    let denom = ((v.sqrt()? / h.bc2.sqrt())? + h.eps)?;
    let p = (p - ((&m / denom)? * (h.lr / h.bc1))?)?;
    Ok((p.to_dtype(var.dtype())?, m, v))
}

/// A parameter's AdamW update in one pass over (p, g, m, v), for f32 CPU tensors; `None` when
/// they are not (the caller composes the update from tensor ops). The composed update is about
/// fifteen passes over each parameter, each allocating a new tensor. This is the same
/// arithmetic, operation for operation (candle's `x * c` is `x · c + 0` in f32, `x / c` is
/// `x · (1/c) + 0`, `x + c` is `x · 1 + c`), so the numbers are bit for bit those of the
/// composed path (tested).
fn fused_update(
    var: &Var,
    g: Option<&Tensor>,
    m: &Tensor,
    v: &Tensor,
    h: &Hyper,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    let p = var.as_tensor();
    let all = [Some(p), g, Some(m), Some(v)];
    let fits = |t: &Tensor| {
        crate::fused::applies(t) && t.is_contiguous() && t.elem_count() == p.elem_count()
    };
    if !all.iter().flatten().all(|t| fits(t)) {
        return Ok(None);
    }
    let AdamWConsts {
        scale,
        b1,
        one_minus_b1,
        b2,
        one_minus_b2,
        decay,
        inv_sqrt_bc2,
        eps,
        step,
    } = f32_consts(h);
    let n = p.elem_count();
    let (mut p_new, mut m_new, mut v_new) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    {
        let (p_s, p_l) = p.storage_and_layout();
        let (m_s, m_l) = m.storage_and_layout();
        let (v_s, v_l) = v.storage_and_layout();
        let g_sl = g.map(|g| g.storage_and_layout());
        let p_x = cpu_f32(&p_s, p_l)?;
        let m_x = cpu_f32(&m_s, m_l)?;
        let v_x = cpu_f32(&v_s, v_l)?;
        let g_x = match &g_sl {
            Some((s, l)) => Some(cpu_f32(s, l)?),
            None => None,
        };
        // One element: (p, m, v) from the clipped gradient `gs`.
        let elem = |gs: f32, p: f32, m: f32, v: f32| -> (f32, f32, f32) {
            let m1 = (m * b1 + 0.0) + (gs * one_minus_b1 + 0.0);
            let v1 = (v * b2 + 0.0) + ((gs * gs) * one_minus_b2 + 0.0);
            let denom = (v1.sqrt() * inv_sqrt_bc2 + 0.0) * 1.0 + eps;
            ((p * decay + 0.0) - ((m1 / denom) * step + 0.0), m1, v1)
        };
        // Equal-length slices and a branch-free body, so the loop compiles to vector code.
        let update = |start: usize, pn: &mut [f32], mn: &mut [f32], vn: &mut [f32]| {
            let len = pn.len();
            let (mn, vn) = (&mut mn[..len], &mut vn[..len]);
            let p = &p_x[start..start + len];
            let m = &m_x[start..start + len];
            let v = &v_x[start..start + len];
            match g_x {
                Some(g) => {
                    let g = &g[start..start + len];
                    for j in 0..len {
                        (pn[j], mn[j], vn[j]) = elem(g[j] * scale + 0.0, p[j], m[j], v[j]);
                    }
                }
                // A missing gradient is a zero tensor: 0 · scale + 0 = 0.
                None => {
                    for j in 0..len {
                        (pn[j], mn[j], vn[j]) = elem(0.0, p[j], m[j], v[j]);
                    }
                }
            }
        };
        const CHUNK: usize = 1 << 16;
        if crate::fused::worth_splitting(n, 2 * CHUNK) {
            use rayon::prelude::*;
            p_new
                .par_chunks_mut(CHUNK)
                .zip(m_new.par_chunks_mut(CHUNK))
                .zip(v_new.par_chunks_mut(CHUNK))
                .enumerate()
                .for_each(|(b, ((pn, mn), vn))| update(b * CHUNK, pn, mn, vn));
        } else {
            update(0, &mut p_new, &mut m_new, &mut v_new);
        }
    }
    let shape = p.shape();
    let dev = p.device();
    Ok(Some((
        Tensor::from_vec(p_new, shape, dev)?,
        Tensor::from_vec(m_new, shape, dev)?,
        Tensor::from_vec(v_new, shape, dev)?,
    )))
}

/// The f32 constants of one AdamW update (what candle's affine maps multiply by and add): the
/// one-pass update's on the CPU (`fused_update`) and in the CUDA kernel (kernels/adamw.cu).
#[derive(Debug, Clone, Copy)]
pub struct AdamWConsts {
    pub scale: f32,
    pub b1: f32,
    pub one_minus_b1: f32,
    pub b2: f32,
    pub one_minus_b2: f32,
    pub decay: f32,
    pub inv_sqrt_bc2: f32,
    pub eps: f32,
    pub step: f32,
}

/// The f32 constants of the one-pass update for `h`.
fn f32_consts(h: &Hyper) -> AdamWConsts {
    AdamWConsts {
        scale: h.scale as f32,
        b1: h.b1 as f32,
        one_minus_b1: (1.0 - h.b1) as f32,
        b2: h.b2 as f32,
        one_minus_b2: (1.0 - h.b2) as f32,
        decay: (1.0 - h.lr * h.weight_decay) as f32,
        inv_sqrt_bc2: (1.0 / h.bc2.sqrt()) as f32,
        eps: h.eps as f32,
        step: (h.lr / h.bc1) as f32,
    }
}

/// What the device's step left to read: ‖g‖² before clipping, and whether every parameter is
/// still finite.
struct DeviceStep {
    squared_norm: f64,
    params_finite: bool,
}

/// The whole step on CUDA (`cuda::step`); `None` where it does not apply (off CUDA, or a
/// parameter it cannot update in place), and the caller updates tensor by tensor.
#[cfg(feature = "cuda")]
fn cuda_step(opt: &AdamW, grads: &Gradients, lr: f64) -> Result<Option<DeviceStep>> {
    let c = f32_consts(&opt.hyper(1.0, lr));
    Ok(cuda::step(
        &opt.vars,
        &opt.names,
        &opt.m,
        &opt.v,
        grads,
        &c,
        opt.spec.grad_clip,
    )?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_step(_: &AdamW, _: &Gradients, _: f64) -> Result<Option<DeviceStep>> {
    Ok(None)
}

/// The f32 elements of a contiguous CPU tensor's storage.
fn cpu_f32<'a>(s: &'a candle_core::Storage, l: &candle_core::Layout) -> Result<&'a [f32]> {
    let candle_core::Storage::Cpu(cpu) = s else {
        return Err(candle_core::Error::Msg("fused AdamW: not a CPU tensor".into()).into());
    };
    Ok(crate::fused::slice_f32(cpu, l, "fused AdamW")?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn randn(seed: u64, n: usize, std: f32) -> Tensor {
        let mut rng = crate::rng::SplitMix64::new(seed);
        let x: Vec<f32> = (0..n)
            .map(|_| (rng.next_f64() as f32 - 0.5) * 2.0 * std)
            .collect();
        Tensor::from_vec(x, n, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_one_pass_update_is_the_composed_one_bit_for_bit() {
        // Sizes below and above the parallel split; a missing gradient; zero moments (the first
        // step) and negative zeros in the gradient; clipping and no clipping, with decay.
        for (n, seed) in [(7usize, 1u64), (1000, 2), (300_001, 3)] {
            let var = Var::from_tensor(&randn(seed, n, 1.0)).unwrap();
            let m = randn(seed + 10, n, 0.01);
            let v = randn(seed + 20, n, 0.01).abs().unwrap();
            let mut g = randn(seed + 30, n, 0.5).to_vec1::<f32>().unwrap();
            g[0] = -0.0;
            g[n / 2] = 0.0;
            let g = Tensor::from_vec(g, n, &Device::Cpu).unwrap();
            let zeros = Tensor::zeros(n, DType::F32, &Device::Cpu).unwrap();
            for (scale, t, grad, (m, v)) in [
                (1.0, 1, Some(&g), (&zeros, &zeros)),
                (0.37, 5, Some(&g), (&m, &v)),
                (1.0, 3, None, (&m, &v)),
            ] {
                let h = Hyper {
                    scale,
                    b1: 0.9,
                    b2: 0.999,
                    lr: 1e-3,
                    weight_decay: 0.01,
                    bc1: 1.0 - 0.9f64.powi(t),
                    bc2: 1.0 - 0.999f64.powi(t),
                    eps: 1e-8,
                };
                let fused = fused_update(&var, grad, m, v, &h)
                    .unwrap()
                    .expect("CPU f32");
                let composed = composed_update(&var, grad, m, v, &h).unwrap();
                for (a, b) in [
                    (&fused.0, &composed.0),
                    (&fused.1, &composed.1),
                    (&fused.2, &composed.2),
                ] {
                    let a = a.to_vec1::<f32>().unwrap();
                    let b = b.to_vec1::<f32>().unwrap();
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "n={n} t={t} scale={scale}"
                    );
                }
            }
        }
        // Not f32: the composed path.
        let var = Var::from_tensor(&randn(9, 4, 1.0).to_dtype(DType::F64).unwrap()).unwrap();
        let z = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let h = Hyper {
            scale: 1.0,
            b1: 0.9,
            b2: 0.999,
            lr: 1e-3,
            weight_decay: 0.0,
            bc1: 0.1,
            bc2: 0.001,
            eps: 1e-8,
        };
        assert!(fused_update(&var, None, &z, &z, &h).unwrap().is_none());
    }
}

/// The launches of `kernels/adamw.cu`: a whole model's step in one reduction, one update per
/// parameter dtype and one read-back; the CPU twin of each element is [`fused_update`].
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{DType, Device, Storage, Tensor, Var};

    use super::{AdamWConsts, DeviceStep, Gradients};
    use crate::fused::launch::{kernel, ptx};

    const PTX: (&str, &str) = ptx!("adamw");
    use crate::fused::launch::sizes::ADAMW_THREADS as THREADS;
    /// Elements per block: `ADAMW_CHUNK` of kernels/launch.cuh, as the kernel reads it.
    const CHUNK: usize = crate::fused::launch::sizes::ADAMW_CHUNK as usize;

    /// The kernel's `AdamWConsts`: the f32 constants of the update but the clip scale, which
    /// the kernel forms from the norm on the device.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct KernelConsts {
        b1: f32,
        one_minus_b1: f32,
        b2: f32,
        one_minus_b2: f32,
        decay: f32,
        inv_sqrt_bc2: f32,
        eps: f32,
        step: f32,
    }

    // SAFETY: a plain #[repr(C)] struct of f32s, the layout of the kernel's struct.
    unsafe impl DeviceRepr for KernelConsts {}

    /// One tensor's row of the device table.
    struct Entry {
        p: u64,
        g: u64,
        m: u64,
        v: u64,
        len: usize,
    }

    /// The device table of `entries` (kernels/adamw.cu: five words a tensor, then where each
    /// tensor's chunks start) and its number of chunks.
    fn table(entries: &[&Entry]) -> (Vec<u64>, u32) {
        let mut words = Vec::with_capacity(6 * entries.len() + 1);
        for e in entries {
            words.extend([e.p, e.g, e.m, e.v, e.len as u64]);
        }
        let mut chunks = 0u64;
        for e in entries {
            words.push(chunks);
            chunks += e.len.div_ceil(CHUNK) as u64;
        }
        words.push(chunks);
        (words, chunks as u32)
    }

    /// The address of `t`'s first element on `stream`'s device, if `t` is a contiguous CUDA
    /// tensor of `dtype`.
    fn address(t: &Tensor, dtype: DType, stream: &CudaStream) -> candle_core::Result<Option<u64>> {
        if t.dtype() != dtype {
            return Ok(None);
        }
        let (storage, layout) = t.storage_and_layout();
        let (Storage::Cuda(s), Some((start, _))) = (&*storage, layout.contiguous_offsets()) else {
            return Ok(None);
        };
        let base = match dtype {
            DType::F32 => s.as_cuda_slice::<f32>()?.device_ptr(stream).0,
            DType::BF16 => s.as_cuda_slice::<half::bf16>()?.device_ptr(stream).0,
            _ => return Ok(None),
        };
        Ok(Some(base + (start * dtype.size_in_bytes()) as u64))
    }

    fn blocks(n: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One AdamW step of `vars` (f32 or bf16, each with f32 moments `m`, `v`) on CUDA: ‖g‖² of
    /// every gradient in one reduction, the clip scale and the update on the device, each
    /// dtype's tensors in one launch, moments and parameters written in place; then ‖g‖² and
    /// whether every parameter is finite, read back in one copy. `None` (nothing launched) when
    /// the parameters are not all contiguous f32/bf16 CUDA tensors with f32 moments.
    pub(super) fn step(
        vars: &[Var],
        names: &[String],
        m: &[Tensor],
        v: &[Tensor],
        grads: &Gradients,
        c: &AdamWConsts,
        max_norm: f64,
    ) -> candle_core::Result<Option<DeviceStep>> {
        let Some(Device::Cuda(dev)) = vars.first().map(|v| v.device().clone()) else {
            return Ok(None);
        };
        // The gradients the entries point into, kept alive until the read-back below has
        // waited for every launch that reads them.
        let Some((entries, kept)) = entries(&dev, vars, names, m, v, grads)? else {
            return Ok(None);
        };
        let all: Vec<&Entry> = entries.iter().map(|(_, e)| e).collect();
        let (words, chunks) = table(&all);
        let words = dev.clone_htod(&words)?;
        let n = all.len() as u32;
        let mut out = dev.alloc_zeros::<f64>(2)?;
        // ‖g‖²: a partial per chunk, then their sum in chunk order.
        let mut partials = dev.alloc_zeros::<f64>((chunks as usize).max(1))?;
        if chunks > 0 {
            let f = kernel!(dev, "adamw_sq_partials", PTX)?;
            let mut b = f.builder();
            b.arg(&words).arg(&n).arg(&mut partials);
            unsafe { b.launch(blocks(chunks)) }.w()?;
        }
        let f = kernel!(dev, "adamw_sq_total", PTX)?;
        let mut b = f.builder();
        b.arg(&partials).arg(&chunks).arg(&mut out);
        unsafe { b.launch(blocks(1)) }.w()?;
        let kc = KernelConsts {
            b1: c.b1,
            one_minus_b1: c.one_minus_b1,
            b2: c.b2,
            one_minus_b2: c.one_minus_b2,
            decay: c.decay,
            inv_sqrt_bc2: c.inv_sqrt_bc2,
            eps: c.eps,
            step: c.step,
        };
        for (dtype, name) in [
            (DType::F32, "adamw_update_f32"),
            (DType::BF16, "adamw_update_bf16"),
        ] {
            let these: Vec<&Entry> = entries
                .iter()
                .filter(|(d, _)| *d == dtype)
                .map(|(_, e)| e)
                .collect();
            let (words, chunks) = table(&these);
            if chunks == 0 {
                continue;
            }
            let words: CudaSlice<u64> = dev.clone_htod(&words)?;
            let n = these.len() as u32;
            let f = kernel!(dev, name, PTX)?;
            let mut b = f.builder();
            b.arg(&words).arg(&n).arg(&mut out).arg(&max_norm).arg(&kc);
            // SAFETY: every address in `words` is a live, contiguous tensor of the length beside
            // it (the parameters and moments owned by the optimizer, the gradients in `kept`),
            // and no two tensors overlap; they stay alive until the read-back below returns.
            unsafe { b.launch(blocks(chunks)) }.w()?;
        }
        let read = dev.clone_dtoh(&out)?;
        drop(kept);
        Ok(Some(DeviceStep {
            squared_norm: read[0],
            params_finite: read[1] == 0.0,
        }))
    }

    /// Each parameter's table entry (its dtype; the addresses of p, g, m, v and its length)
    /// and the contiguous f32 gradients the entries point into; `None` when a tensor is not a
    /// contiguous f32/bf16 tensor on `dev`.
    #[allow(clippy::type_complexity)]
    fn entries(
        dev: &CudaDevice,
        vars: &[Var],
        names: &[String],
        m: &[Tensor],
        v: &[Tensor],
        grads: &Gradients,
    ) -> candle_core::Result<Option<(Vec<(DType, Entry)>, Vec<Tensor>)>> {
        let stream = dev.cuda_stream();
        let mut kept = Vec::new();
        let mut entries = Vec::with_capacity(vars.len());
        for (i, var) in vars.iter().enumerate() {
            let dtype = var.dtype();
            let p = address(var.as_tensor(), dtype, &stream)?;
            let (mi, vi) = (
                address(&m[i], DType::F32, &stream)?,
                address(&v[i], DType::F32, &stream)?,
            );
            let (Some(p), Some(mi), Some(vi)) = (p, mi, vi) else {
                return Ok(None);
            };
            if !var.device().same_device(&Device::Cuda(dev.clone())) {
                return Ok(None);
            }
            let g = match grads.get(&names[i]) {
                Some(g) => {
                    let g = g.to_dtype(DType::F32)?.contiguous()?;
                    let at = address(&g, DType::F32, &stream)?;
                    kept.push(g);
                    at.ok_or_else(|| {
                        candle_core::Error::Msg("acpo-adamw: a gradient off CUDA".into())
                    })?
                }
                None => 0,
            };
            entries.push((
                dtype,
                Entry {
                    p,
                    g,
                    m: mi,
                    v: vi,
                    len: var.elem_count(),
                },
            ));
        }
        Ok(Some((entries, kept)))
    }
}
