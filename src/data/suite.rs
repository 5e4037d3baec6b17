//! What a run reads, in the paper's terms: the suite (the real datasets or the synthetic task),
//! the prompt templates, the four benchmarks of Table 1 with the problem counts that weight its
//! last column, and a run's data settings.

use serde::{Deserialize, Serialize};

/// Where prompts and benchmarks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataSuite {
    /// DAPO-Math-17k for training and the four real benchmarks (local JSONL dir or HF hub).
    Real,
    /// The seeded synthetic task (mini/smoke scales): a training set and four benchmark twins
    /// with the same roles and sizes as the real ones.
    Synthetic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptTemplate {
    /// DAPO's training prompt: solve, then `Answer: ...` on the last line.
    Dapo,
    /// The evaluation prompt: reason step by step, final answer in `\boxed{}`.
    Boxed,
    /// DAPO's instruction in one short line (`Answer: ...` last), for tiny-context models of
    /// the mini scale: the full DAPO template would be most of their sequence.
    Answer,
    /// The problem text alone.
    Raw,
}

/// The evaluation benchmarks of Table 1. Each one's size (the problem count that weights the
/// "weighted accuracy" column), name and heading are its dataset's ([`super::spec`]): Table 1 has
/// a column for each of [`Benchmark::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Benchmark {
    Math500,
    Minerva,
    Olympiadbench,
    AimeLike,
}

impl Benchmark {
    pub const ALL: [Benchmark; 4] = [
        Self::Math500,
        Self::Minerva,
        Self::Olympiadbench,
        Self::AimeLike,
    ];

    /// Problem count, the weight of the benchmark in the weighted accuracy.
    pub fn size(self) -> usize {
        super::spec(self).rows
    }

    /// The name used in files and metric keys (`val-core/<name>/acc/mean@k`).
    pub fn name(self) -> &'static str {
        super::spec(self).name
    }

    /// Its column's heading in Table 1.
    pub fn heading(self) -> &'static str {
        super::spec(self).heading
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataSpec {
    pub suite: DataSuite,
    pub prompt_template: PromptTemplate,
    pub apply_chat_template: bool,
    pub max_prompt_length: usize,
    pub max_response_length: usize,
    pub shuffle: bool,
}
