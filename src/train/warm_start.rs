//! The warm start of the mini scale: a short supervised fine-tune on the synthetic
//! training set's worked solutions, so each tiny model starts RL with partial accuracy, the
//! regime where RL has signal (the paper's models start from pretrained weights).
//!
//! Each example is a training problem under the `answer` or `boxed` prompt template (alternating
//! by index and epoch, so the model follows both instructions) and one of its worked solutions,
//! in a style drawn afresh for every use (path, wording; `synthetic::Style`), in the matching
//! answer style, ending in EOS. The policy it leaves spreads its mass over the styles: the
//! entropy the paper's pretrained policies start RL with. The loss is the mean negative
//! log-likelihood of the response tokens; the prompt is context only. Same model, layout and
//! AdamW as RL.

use std::time::Instant;

use candle_core::{DType, Device};
use serde::Serialize;

use super::batch::{epoch_order, layout, LOGIT_CHUNK};
use super::{Result, TrainError};
use crate::data::synthetic;
use crate::data::PromptTemplate;
use crate::model::init::WarmStartSpec;
use crate::model::qwen::Qwen;
use crate::model::tokenizer::Tokenizer;
use crate::model::{Params, QwenConfig};
use crate::optim::{AdamW, Gradients};
use crate::optim::{LrSchedule, OptimSpec};

/// What the warm start did; written to `warm_start.json` beside the weights.
#[derive(Debug, Clone, Serialize)]
pub struct WarmStartReport {
    pub steps: usize,
    pub examples: usize,
    pub response_tokens: usize,
    /// Mean response-token NLL of the first and last `LOSS_WINDOW` steps.
    pub first_loss: f64,
    pub last_loss: f64,
    /// (step, loss) every `LOSS_EVERY` steps.
    pub loss_curve: Vec<(usize, f64)>,
    pub seconds: f64,
    pub synthetic_version: &'static str,
}

const LOSS_WINDOW: usize = 10;
const LOSS_EVERY: usize = 10;

/// Prompts and responses, token ids.
type Batch = (Vec<Vec<u32>>, Vec<Vec<u32>>);

/// The worked solutions in the epochs' order: each epoch a seeded shuffle, its template and
/// style alternating by epoch; solutions longer than the limit skipped.
struct Draw<'a> {
    items: &'a [synthetic::Item],
    seed: u64,
    order: Vec<usize>,
    epoch: u64,
    cursor: usize,
    /// Solutions skipped since the last that fit: a limit no solution fits is an error.
    skipped_in_row: usize,
}

impl Draw<'_> {
    /// The next `spec.batch_size` (prompt, response) token ids, each response ending in `eos`.
    fn batch(&mut self, tokenizer: &Tokenizer, eos: u32, spec: &WarmStartSpec) -> Result<Batch> {
        let (items, seed) = (self.items, self.seed);
        let (mut prompts, mut responses) = (Vec::new(), Vec::new());
        while prompts.len() < spec.batch_size {
            if self.cursor == self.order.len() {
                self.epoch += 1;
                self.order = epoch_order(items.len(), seed, self.epoch, true);
                self.cursor = 0;
            }
            let index = self.order[self.cursor];
            self.cursor += 1;
            let template = if (index as u64 + self.epoch).is_multiple_of(2) {
                PromptTemplate::Answer
            } else {
                PromptTemplate::Boxed
            };
            let item = &items[index];
            let style = synthetic::style(seed, self.epoch, index);
            let mut response = tokenizer.encode(&item.solution(template, style))?;
            response.push(eos);
            if response.len() > spec.max_response_length {
                self.skipped_in_row += 1;
                if self.skipped_in_row > items.len() {
                    return Err(TrainError::NoSolutionFits {
                        max_response_length: spec.max_response_length,
                    });
                }
                continue;
            }
            self.skipped_in_row = 0;
            let prompt =
                crate::eval::encode_prompt(tokenizer, template, false, &item.problem.problem)?;
            prompts.push(prompt);
            responses.push(response);
        }
        Ok((prompts, responses))
    }
}

/// Fine-tunes `params` in place; `progress(step, total, loss)` after every step.
pub fn warm_start(
    cfg: &QwenConfig,
    params: &Params,
    tokenizer: &Tokenizer,
    spec: &WarmStartSpec,
    seed: u64,
    device: &Device,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<WarmStartReport> {
    let started = Instant::now();
    let items = synthetic::train_items();
    let eos = tokenizer.eos_id().ok_or(TrainError::NoEos)?;
    let optim = OptimSpec {
        lr: spec.lr,
        lr_schedule: LrSchedule::Constant,
        warmup_steps: spec.warmup_steps,
        grad_clip: 1.0,
        weight_decay: 0.0,
        betas: [0.9, 0.999],
        eps: 1e-8,
    };
    let mut opt = AdamW::new(params, &optim)?;
    let mut draw = Draw {
        items: &items,
        seed,
        order: epoch_order(items.len(), seed, 0, true),
        epoch: 0,
        cursor: 0,
        skipped_in_row: 0,
    };
    let (mut losses, mut curve) = (Vec::with_capacity(spec.steps), Vec::new());
    let (mut examples, mut tokens) = (0usize, 0usize);
    for step in 0..spec.steps {
        let (prompts, responses) = draw.batch(tokenizer, eos, spec)?;
        tokens += responses.iter().map(Vec::len).sum::<usize>();
        examples += prompts.len();
        let batch = layout(
            &prompts.iter().collect::<Vec<_>>(),
            &responses.iter().collect::<Vec<_>>(),
            tokenizer.pad_id(),
            device,
        )?;
        let model = Qwen::new(cfg, params, false)?;
        let hidden = batch.response_hidden(&model)?;
        let (lp, _) = model.token_log_probs(&hidden, &batch.targets, 1.0, LOGIT_CHUNK, false)?;
        let n = batch.mask.sum_all()?.to_scalar::<f32>()? as f64;
        let nll = ((lp * &batch.mask)?.sum_all()?.neg()? / n)?;
        let loss = nll.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let grads = Gradients::from_store(params, &nll.backward()?)?;
        super::update::apply_update(&mut opt, &grads, step + 1, "warm_start/grad_norm")?;
        if !loss.is_finite() {
            return Err(TrainError::NonFinite {
                step: step + 1,
                metric: "warm_start/loss",
                value: loss,
            });
        }
        losses.push(loss);
        if step % LOSS_EVERY == 0 || step + 1 == spec.steps {
            curve.push((step + 1, loss));
        }
        progress(step + 1, spec.steps, loss);
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let w = LOSS_WINDOW.min(losses.len());
    Ok(WarmStartReport {
        steps: spec.steps,
        examples,
        response_tokens: tokens,
        first_loss: mean(&losses[..w]),
        last_loss: mean(&losses[losses.len() - w..]),
        loss_curve: curve,
        seconds: started.elapsed().as_secs_f64(),
        synthetic_version: synthetic::VERSION,
    })
}
