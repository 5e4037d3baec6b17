//! The declared range of every whole-number field of a manifest, in one table, as
//! [`crate::flags`] declares the command line's: a count or a size outside it is refused by
//! `acpo check` (and so at the start of `train`), naming the field and the range, before it can
//! size an allocation or a loop. The bounds refuse what cannot be meant, not what is merely large:
//! each says why it is where it is. What the counts imply together (a step's tokens, the memory
//! they take) is bounded after them (`manifest::bound`).

use crate::flags::{MAX_SEQUENCES, MAX_STEPS, MAX_TOKENS};

use super::{MAX_BATCH, MAX_SAMPLES};

/// Passes over a step's batch (`actor.epochs`; verl's `ppo_epochs`, 1 in the paper): beyond
/// this the policy learns from samples it has long left behind, and a step's update loop runs
/// for hours.
pub const MAX_EPOCHS: usize = 1 << 10;

/// One field's range: `low..=high`, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The field's dotted path.
    pub field: &'static str,
    pub low: u64,
    pub high: u64,
    pub why: &'static str,
}

impl Range {
    /// The range as a refusal says it.
    pub fn describe(&self) -> String {
        format!(
            "a whole number in [{}, {}] ({})",
            self.low, self.high, self.why
        )
    }

    pub fn holds(&self, value: u64) -> bool {
        (self.low..=self.high).contains(&value)
    }
}

const fn range(field: &'static str, low: u64, high: usize, why: &'static str) -> Range {
    Range {
        field,
        low,
        high: high as u64,
        why,
    }
}

const STEPS: &str =
    "training steps; the paper's runs take 100 to 300, 2^24 is years at a second a step";
const WARMUP: &str = "steps of learning-rate warm-up, at most the run's steps";
const TOKENS: &str =
    "tokens of one sequence, at most the longest context a model config may declare";
const SAMPLES: &str = "samples per prompt; the paper uses 8 to 32";

/// Every whole-number field of a manifest (`raw::Manifest`) and its range. A test walks the
/// schema and fails on a whole-number field missing here.
pub const RANGES: &[Range] = &[
    Range {
        field: "seed",
        low: 0,
        high: u64::MAX,
        why: "every u64 is a seed",
    },
    Range {
        field: "model.init.seed",
        low: 0,
        high: u64::MAX,
        why: "every u64 is a seed",
    },
    range("model.max_position_embeddings", 1, MAX_TOKENS, TOKENS),
    range("model.init.warm_start.steps", 1, MAX_STEPS, STEPS),
    range(
        "model.init.warm_start.batch_size",
        1,
        MAX_BATCH,
        "solutions per supervised step; the mini scale uses 32",
    ),
    range("model.init.warm_start.warmup_steps", 0, MAX_STEPS, WARMUP),
    range("model.init.warm_start.max_response_length", 1, MAX_TOKENS, TOKENS),
    range("data.max_prompt_length", 1, MAX_TOKENS, TOKENS),
    range("data.max_response_length", 1, MAX_TOKENS, TOKENS),
    range("rollout.n", 1, MAX_SAMPLES, SAMPLES),
    range(
        "rollout.top_k",
        1,
        crate::model::MAX_VOCAB,
        "tokens kept when sampling (null: no top-k filtering), at most the largest vocabulary a model config may declare",
    ),
    range("actor.optim.warmup_steps", 0, MAX_STEPS, WARMUP),
    range(
        "actor.mini_batch_size",
        1,
        MAX_BATCH,
        "prompts per optimizer step, at most a step's prompts",
    ),
    range(
        "actor.micro_batch_size",
        1,
        MAX_BATCH * MAX_SAMPLES,
        "responses per forward and backward pass, at most a mini-batch's; the paper uses 2 to 16",
    ),
    range(
        "actor.epochs",
        1,
        MAX_EPOCHS,
        "passes over a step's batch; the paper makes 1, and past 2^10 the policy learns from samples long left behind",
    ),
    range("critic.optim.warmup_steps", 0, MAX_STEPS, WARMUP),
    range(
        "trainer.batch_size",
        1,
        MAX_BATCH,
        "prompts per step; the paper uses 512",
    ),
    range("trainer.total_steps", 1, MAX_STEPS, STEPS),
    range("trainer.eval_every", 1, MAX_STEPS, STEPS),
    range("trainer.checkpoint_every", 1, MAX_STEPS, STEPS),
    range(
        "trainer.tails_every",
        0,
        MAX_STEPS,
        "steps between tail histograms, 0 for none",
    ),
    range(
        "trainer.difficulty_probe_k",
        0,
        MAX_SAMPLES,
        "extra samples per prompt at tail steps, as many as rollout.n may take",
    ),
    range("eval.k", 1, MAX_SAMPLES, SAMPLES),
    range("eval.max_new_tokens", 1, MAX_TOKENS, TOKENS),
    range(
        "eval.limit",
        1,
        MAX_SEQUENCES,
        "problems per benchmark; the largest benchmark has 675",
    ),
];

/// The range of `field`.
///
/// # Panics
/// When `field` is not in [`RANGES`]: a programming error the schema test catches.
pub fn of(field: &str) -> &'static Range {
    RANGES
        .iter()
        .find(|r| r.field == field)
        .unwrap_or_else(|| panic!("invariant: `{field}` has a declared range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dotted paths of the whole-number leaves of `v`.
    fn whole_leaves(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, x) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    whole_leaves(x, &path, out);
                }
            }
            serde_json::Value::Array(xs) => xs.iter().for_each(|x| whole_leaves(x, prefix, out)),
            serde_json::Value::Number(n) if !n.is_f64() => out.push(prefix.to_owned()),
            _ => {}
        }
    }

    #[test]
    fn every_whole_number_field_of_the_schema_has_a_declared_range_and_no_other_is_declared() {
        // A manifest with a critic and a warm start, every optional count set.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("experiments/mini/mini-xs-ppo.yaml");
        let (_, mut raw) = crate::manifest::Experiment::load_with_raw(&path).expect("manifest");
        raw.model.max_position_embeddings = Some(1);
        raw.rollout.top_k = Some(1);
        raw.actor.micro_batch_size = Some(1);
        raw.eval.limit = Some(1);
        assert!(raw.critic.is_some());
        assert!(raw
            .model
            .init
            .as_ref()
            .is_some_and(|i| i.warm_start.is_some()));
        let mut leaves = Vec::new();
        whole_leaves(&serde_json::to_value(&raw).expect("json"), "", &mut leaves);
        let missing: Vec<&String> = leaves
            .iter()
            .filter(|f| !RANGES.iter().any(|r| r.field == f.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "whole-number fields without a range: {missing:?}"
        );
        let stale: Vec<&str> = RANGES
            .iter()
            .map(|r| r.field)
            .filter(|f| !leaves.iter().any(|l| l == f))
            .collect();
        assert!(stale.is_empty(), "ranges of no field: {stale:?}");
        for r in RANGES {
            assert!(r.low <= r.high && !r.why.is_empty(), "{r:?}");
        }
    }
}
