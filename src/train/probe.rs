//! Prompt difficulty for the r·Â tails (paper Section 3): at tail steps each prompt's pass rate
//! comes from its group of n responses (GRPO types), or from a probe of k extra samples per
//! prompt (PPO types, n = 1) drawn on random streams no rollout uses. The prompts' tokens'
//! r·Â are then binned by difficulty ([`Tails`]).

use super::step::Rollout;
use super::{Result, Trainer};
use crate::model::qwen::Qwen;
use crate::reward;
use crate::rollout::{self, SampleKey};
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
        let rates = if !due {
            None
        } else if n >= 2 {
            Some(
                correct
                    .chunks(n)
                    .map(|g| g.iter().filter(|c| **c).count() as f64 / n as f64)
                    .collect(),
            )
        } else if exp.trainer.difficulty_probe_k > 0 {
            Some(self.probe_pass_rates(sampler, step, rollout)?)
        } else {
            None
        };
        Ok(rates.map(|r| TailRecorder::new(step, r, n)))
    }

    /// k extra samples per prompt, judged like rollouts: the fraction correct per prompt.
    fn probe_pass_rates(&self, sampler: &Qwen, step: usize, rollout: &Rollout) -> Result<Vec<f64>> {
        let (k, seed) = (self.exp.trainer.difficulty_probe_k, self.exp.seed);
        let prompts: Vec<Vec<u32>> = rollout
            .prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), k))
            .collect();
        let keys: Vec<SampleKey> = rollout
            .indices
            .iter()
            .flat_map(|&p| {
                (0..k as u64).map(move |s| [seed, step as u64, p as u64, PROBE_STREAM + s])
            })
            .collect();
        let outs = rollout::generate(sampler, &prompts, &keys, &self.sample_request())?;
        let mut rates = Vec::with_capacity(rollout.indices.len());
        for (pi, chunk) in outs.chunks(k).enumerate() {
            let gold = &self.problems[rollout.indices[pi]].answer;
            let mut ok = 0;
            for c in chunk {
                ok += usize::from(
                    reward::judge(&self.tokenizer, &c.tokens, gold)?
                        .verdict
                        .correct,
                );
            }
            rates.push(ok as f64 / k as f64);
        }
        Ok(rates)
    }
}
