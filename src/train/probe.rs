//! Prompt difficulty for the r·Â tails (paper Section 3): at tail steps each prompt's pass rate
//! comes from its group of n responses (GRPO types), or from a probe of k extra samples per
//! prompt (PPO types, n = 1) drawn on random streams no rollout uses. The prompts' tokens'
//! r·Â are then binned by difficulty ([`Tails`]).

use super::outcomes::Rollout;
use super::{Result, Trainer};
use crate::model::qwen::Qwen;
use crate::run::tails::{Difficulty, Tails};

/// Sample-index offset of the difficulty probe's random streams (never a rollout's index).
const PROBE_STREAM: u64 = 1 << 40;

/// The tail histograms of one step being filled, with the pass rate of each prompt.
#[derive(Debug, Clone)]
pub struct TailRecorder {
    /// Pass rate per prompt of the batch.
    pub rates: Vec<f64>,
    /// Responses per prompt (row r belongs to prompt r / n).
    pub n: usize,
    pub tails: Tails,
}

impl TailRecorder {
    fn new(step: usize, rates: Vec<f64>, n: usize) -> TailRecorder {
        let mut tails = Tails {
            step,
            ..Tails::default()
        };
        for r in &rates {
            tails.prompts[Difficulty::of(*r) as usize] += 1;
        }
        TailRecorder { rates, n, tails }
    }

    /// Adds r·Â of the valid tokens of rows `first..` (row by row, with their mask).
    pub fn record(&mut self, first: usize, ratio_adv: &[Vec<f32>], mask: &[Vec<f32>]) {
        for (i, (row, m)) in ratio_adv.iter().zip(mask).enumerate() {
            let bucket = self
                .tails
                .bucket(Difficulty::of(self.rates[(first + i) / self.n]));
            row.iter()
                .zip(m)
                .filter(|(_, k)| **k != 0.0)
                .for_each(|(x, _)| bucket.add(*x as f64));
        }
    }
}

impl Trainer {
    /// The step's tail recorder, if this step records tails and the pass rates are known.
    pub(super) fn probe(
        &self,
        sampler: &Qwen,
        step: usize,
        rollout: &Rollout,
        correct: &[bool],
    ) -> Result<Option<TailRecorder>> {
        let exp = &self.exp;
        let n = exp.rollout.n;
        let due = exp.trainer.tails_every > 0 && step.is_multiple_of(exp.trainer.tails_every);
        let k = exp.trainer.difficulty_probe_k;
        let rates = if !due {
            None
        } else if n >= 2 {
            Some(pass_rates(correct, n))
        } else if k > 0 {
            // k extra samples per prompt, judged like rollouts.
            let (indices, prompts) = (&rollout.indices, &rollout.prompts);
            let outs = self.sample_each(sampler, step, indices, prompts, k, PROBE_STREAM, None)?;
            Some(pass_rates(&self.judge_all(indices, &outs, k)?, k))
        } else {
            None
        };
        Ok(rates.map(|r| TailRecorder::new(step, r, n)))
    }
}

/// The fraction correct of each prompt's `per_prompt` consecutive answers.
fn pass_rates(correct: &[bool], per_prompt: usize) -> Vec<f64> {
    correct
        .chunks(per_prompt)
        .map(|g| g.iter().filter(|c| **c).count() as f64 / per_prompt as f64)
        .collect()
}
