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
    /// How the train step computes each decoder layer's backward (`model.layer_backward`);
    /// None: autograd, written or not (left out of the fingerprint, so manifests without it
    /// keep theirs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_backward: Option<LayerBackward>,
    /// The flash kernels' backward (`model.attention_backward`); None: the pair of kernels,
    /// written or not (left out of the fingerprint likewise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_backward: Option<crate::fused::FlashBackward>,
}

impl ModelSpec {
    /// The train step's kernels on `device`: the device's own ([`Kernels::for_device`]) with
    /// the manifest's choices of backward.
    ///
    /// [`Kernels::for_device`]: super::qwen::Kernels::for_device
    pub fn train_kernels(&self, device: &candle_core::Device) -> super::qwen::Kernels {
        let mut kernels = super::qwen::Kernels::for_device(device);
        kernels.layer_by_hand = self.layer_backward == Some(LayerBackward::ByHand);
        if let Some(backward) = self.attention_backward {
            kernels.flash_backward = backward;
        }
        kernels
    }
}

/// How a train step computes a decoder layer's backward: candle's autograd over the composed
/// layer (what every shipped result ran), or the layer's backward written out by hand
/// (`model/qwen/by_hand.rs`: each gradient written once; the same gradients to f32 round-off,
/// tests/it/model.rs). By hand needs `gradient_checkpointing`: it is how the checkpointed
/// backward recomputes a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerBackward {
    #[default]
    Autograd,
    ByHand,
}
