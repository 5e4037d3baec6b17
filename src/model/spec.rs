//! What a manifest says about its model: where it comes from, where it runs and in which
//! precision (`device: cpu | cuda | auto`, `dtype: f32 | bf16 | f16`, also flags);
//! [`super::device`] and [`super::dtype`] turn the last two into candle's.

use serde::{Deserialize, Serialize};

use super::init::ModelInitSpec;
use crate::hub::ModelSource;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
    /// CUDA when this binary was built with it and a GPU is visible, else CPU.
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

/// The model a run trains: its source and how it is held.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    pub source: ModelSource,
    pub dtype: DType,
    pub gradient_checkpointing: bool,
    /// How to create a missing `dir` (smoke and mini scales).
    pub init: Option<ModelInitSpec>,
    /// Overrides config.json's `max_position_embeddings` (left out of the fingerprint when
    /// unset, so manifests without it keep theirs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
}
