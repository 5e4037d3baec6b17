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

use crate::manifest::OptimSpec;
use crate::model::{ModelError, Params, Result};

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
                out.insert(name.clone(), g.to_dtype(DType::F32)?);
            }
        }
        Ok(Gradients(out))
    }

    pub fn from_map(map: BTreeMap<String, Tensor>) -> Gradients {
        Gradients(map)
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

    /// Clips `grads` to the manifest's norm and applies one AdamW update.
    pub fn step(&mut self, grads: &Gradients) -> Result<StepReport> {
        let norm = grads.global_norm()?;
        let lr = self.next_lr();
        if !norm.is_finite() {
            return Ok(StepReport {
                grad_norm: norm,
                lr,
                applied: false,
            });
        }
        let coef = self.spec.grad_clip / (norm + 1e-6);
        let scale = if coef < 1.0 { coef } else { 1.0 };
        let [b1, b2] = self.spec.betas;
        let t = (self.t + 1) as i32;
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for i in 0..self.vars.len() {
            let var = &self.vars[i];
            let g = match grads.get(&self.names[i]) {
                Some(g) => (g * scale)?,
                None => Tensor::zeros(var.shape(), DType::F32, var.device())?,
            };
            self.m[i] = ((&self.m[i] * b1)? + (&g * (1.0 - b1))?)?;
            self.v[i] = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let p = var.as_tensor().to_dtype(DType::F32)?;
            let p = (p * (1.0 - lr * self.spec.weight_decay))?;
            let denom = ((self.v[i].sqrt()? / bc2.sqrt())? + self.spec.eps)?;
            let p = (p - ((&self.m[i] / denom)? * (lr / bc1))?)?;
            var.set(&p.to_dtype(var.dtype())?)?;
        }
        self.t += 1;
        Ok(StepReport {
            grad_norm: norm,
            lr,
            applied: true,
        })
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
        crate::atomic::save_safetensors(&tensors, path).map_err(|reason| ModelError::Weights {
            path: path.to_owned(),
            reason,
        })
    }

    /// Restores the state written by [`AdamW::save`] for the same parameters.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let device = self
            .vars
            .first()
            .map(|v| v.device().clone())
            .unwrap_or(candle_core::Device::Cpu);
        let mut tensors =
            candle_core::safetensors::load(path, &device).map_err(|e| ModelError::Weights {
                path: path.to_owned(),
                reason: e.to_string(),
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
