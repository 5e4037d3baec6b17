//! What a manifest's counts imply in memory, checked before training starts: each count is in
//! its range ([`super::ranges`]), but their products (a step's prompts × samples × tokens, a
//! micro-batch's forward over the model) can still ask for more than the machine has. `acpo
//! check` and the start of `train` refuse such a manifest with one message naming the fields,
//! never an allocation that aborts the process.
//!
//! Every term counts only buffers whose size the counts fix, as the trainer holds them at once
//! when its sequences reach the lengths the manifest allows (RL responses do: the paper's run
//! to the limit, as `acpo generate` sizes its check): a floor of that case, not an estimate of a
//! run's peak. A manifest that passes may still be refused later by the finer checks of the
//! model code ([`crate::model::budget`]).

/// The size of one evaluation sample's record (`eval::SampleRecord`, which sits above the
/// manifest and cannot be named here; `eval`'s tests hold this to at least its size).
pub const SAMPLE_RECORD_BYTES: u128 = 192;

use candle_core::Device;

use super::Experiment;
use crate::model::QwenConfig;

/// Bytes a step's batch holds per sequence position, whatever the model: the layout's token
/// ids and positions (u32 each) and validity (u8) over prompt and response
/// ([`crate::train::batch::Layout`]).
const LAYOUT_BYTES_PER_POSITION: u128 = 4 + 4 + 1;

/// Bytes per response token beyond the layout: the targets (u32) and the mask (f32) of the
/// layout, the old log-probs (f32) and the sampled ids the rollout returns (u32).
const BYTES_PER_RESPONSE_TOKEN: u128 = 4 + 4 + 4 + 4;

/// Bytes a parameter holds in training: its f32 master, its f32 gradient and AdamW's two f32
/// moments.
const TRAINING_BYTES_PER_PARAMETER: u128 = 4 * 4;

/// One term of the floor: its bytes, the field that leads it and what else sets them.
struct Term {
    bytes: u128,
    field: &'static str,
    with: &'static str,
}

impl Experiment {
    /// The floor of the memory this run's counts take, term by term.
    fn memory_terms(&self, cfg: Option<&QwenConfig>) -> Vec<Term> {
        let (p, r) = (
            self.data.max_prompt_length as u128,
            self.data.max_response_length as u128,
        );
        let sequence = LAYOUT_BYTES_PER_POSITION * (p + r) + BYTES_PER_RESPONSE_TOKEN * r;
        let sequences = self.trainer.batch_size as u128 * self.rollout.n as u128;
        let mut terms = vec![Term {
            bytes: sequences * sequence,
            field: "trainer.batch_size",
            with:
                "× rollout.n sequences of data.max_prompt_length + data.max_response_length tokens",
        }];
        // an evaluation keeps a record of every sample until it is written
        let records = self.eval.problems() as u128 * self.eval.sampling.n as u128;
        terms.push(Term {
            bytes: records * SAMPLE_RECORD_BYTES,
            field: "eval.k",
            with: "samples of each of eval.benchmarks' problems (at most eval.limit each), one record each",
        });
        if let Some(w) = self.model.init.as_ref().and_then(|i| i.warm_start.as_ref()) {
            terms.push(Term {
                // the loss of every step is kept (8 bytes each)
                bytes: 8 * w.steps as u128,
                field: "model.init.warm_start.steps",
                with: "losses, one kept per step",
            });
        }
        if let (Some(cfg), crate::model::spec::Device::Cpu) = (cfg, self.device) {
            // On the CPU the model lives on the host too: its training state (twice with a
            // critic), the gradient sums of every micro-batch of a mini-batch (they run side by
            // side, each into sums of its own: `train::update`) and one micro-batch's forward,
            // without its graph.
            let models: u128 = if self.critic.is_some() { 2 } else { 1 };
            let micro = self.actor.micro_batch_size;
            let micro_batches = (self.actor.mini_batch_size * self.rollout.n).div_ceil(micro);
            let t = self.data.max_prompt_length + self.data.max_response_length;
            let params = cfg.parameter_count();
            terms.push(Term {
                bytes: models * TRAINING_BYTES_PER_PARAMETER * params
                    + 4 * micro_batches as u128 * params
                    + cfg.forward_bytes(micro, t, 0, 4, true),
                field: "actor.micro_batch_size",
                with: "sequences of data.max_prompt_length + data.max_response_length tokens in a forward, beside the model's training state",
            });
        }
        terms
    }

    /// Refuses the manifest when the floor of its memory (`memory_terms`) exceeds what
    /// this process can take from the host; the message names the fields of the largest term.
    pub fn check_memory(&self, cfg: Option<&QwenConfig>) -> Result<(), String> {
        let terms = self.memory_terms(cfg);
        let need: u128 = terms.iter().map(|t| t.bytes).sum();
        let Some(largest) = terms.iter().max_by_key(|t| t.bytes) else {
            return Ok(());
        };
        crate::model::budget::check(&Device::Cpu, need, || {
            format!(
                "field `{}` ({} {}, the largest part of what this manifest's counts hold at least)",
                largest.field, largest.field, largest.with
            )
        })
        .map_err(|e| e.to_string())
    }
}
