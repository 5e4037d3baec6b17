//! The evaluation before the first step, made once for the runs of a process that start from
//! the same model and evaluate it the same way.
//!
//! A fresh run's step-0 evaluation depends on its start model, its `eval` section, its data
//! suite and where the data is read, its device, its sampler's KV-cache layout (the same bits
//! on the CPU, not on a GPU) and its seed (sampling is keyed by seed,
//! benchmark, problem and sample: [`crate::eval`]), and on nothing its algorithm sets: the four
//! methods of a seed evaluate one model to the same bytes. `reproduce` and `sweep` train many
//! such runs in one process (the main job's 80 runs need 20 distinct step-0 evaluations, not 80:
//! the 60 it no longer makes were 15 % of its 400 evaluations): the first run of a key
//! evaluates, the others take its summary, and a run's `eval.jsonl` is the same either way
//! (tests/it/train.rs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::data::DataLocation;
use crate::eval::EvalSummary;
use crate::manifest::Experiment;

/// Step-0 evaluation summaries by what they depend on ([`StartEvals::key`]).
#[derive(Debug, Default)]
pub struct StartEvals {
    slots: Mutex<HashMap<String, Arc<Mutex<Option<EvalSummary>>>>>,
    evaluated: AtomicUsize,
    reused: AtomicUsize,
}

impl StartEvals {
    pub fn new() -> StartEvals {
        StartEvals::default()
    }

    /// Everything a fresh run's step-0 evaluation depends on, as one string. The start model is
    /// named by its source and its `init` section: within one process the created models are
    /// made (or checked against their fingerprint) before any run starts, so one name is one
    /// set of weights.
    pub fn key(exp: &Experiment, data: &DataLocation) -> String {
        let of = serde_json::json!({
            "model": exp.model,
            "device": exp.device,
            "kv_layout": exp.kv_layout(),
            "seed": exp.seed,
            "suite": exp.data.suite,
            "eval": exp.eval,
        });
        format!("{of} data={data:?}")
    }

    /// The summary for `key`: the one made earlier in this process, else `evaluate`'s (kept for
    /// the next run). A run asking while another evaluates the same key waits for it; an
    /// evaluation that fails keeps nothing, and the next run of the key evaluates again.
    pub fn get_or_evaluate<E>(
        &self,
        key: String,
        evaluate: impl FnOnce() -> Result<EvalSummary, E>,
    ) -> Result<EvalSummary, E> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.entry(key).or_default().clone()
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(summary) = slot.as_ref() {
            self.reused.fetch_add(1, Ordering::SeqCst);
            return Ok(summary.clone());
        }
        let summary = evaluate()?;
        self.evaluated.fetch_add(1, Ordering::SeqCst);
        *slot = Some(summary.clone());
        Ok(summary)
    }

    /// Step-0 evaluations made, and taken from an earlier run of the same key.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.evaluated.load(Ordering::SeqCst),
            self.reused.load(Ordering::SeqCst),
        )
    }
}
