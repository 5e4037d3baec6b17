//! The one model loader: train, eval, generate and the benchmarks get their model here, with
//! one device and dtype policy ([`super::device`], [`super::dtype`]).

use std::path::PathBuf;

use candle_core::Device;

use super::tokenizer::Tokenizer;
use super::{Params, QwenConfig, Result};
use crate::hub::{self, HubOptions};
use crate::manifest::{self, ModelSource};

/// A model's files, config, tokenizer and weights on their device.
pub struct LoadedModel {
    pub dir: PathBuf,
    pub cfg: QwenConfig,
    pub tokenizer: Tokenizer,
    pub params: Params,
    pub device: Device,
}

/// Resolves `source` (a directory, or a hub revision through the cache) and loads it on the
/// device and in the dtype a manifest names.
pub fn load(
    source: &ModelSource,
    hub: &HubOptions,
    device: manifest::Device,
    dtype: manifest::DType,
) -> Result<LoadedModel> {
    let dir = hub::resolve(source, hub)?;
    let cfg = QwenConfig::load(&dir.join("config.json"))?;
    let tokenizer = Tokenizer::load(&dir)?;
    let device = super::device(device)?;
    let params = Params::load_dir(&dir, super::dtype(dtype), &device)?;
    Ok(LoadedModel {
        dir,
        cfg,
        tokenizer,
        params,
        device,
    })
}

impl LoadedModel {
    /// The tokens that end a completion: the config's EOS ids and the tokenizer's.
    pub fn eos_ids(&self) -> Vec<u32> {
        eos_ids(&self.cfg, &self.tokenizer)
    }
}

/// The tokens that end a completion: the config's EOS ids and the tokenizer's.
pub fn eos_ids(cfg: &QwenConfig, tokenizer: &Tokenizer) -> Vec<u32> {
    let mut eos = cfg.eos_token_ids();
    eos.extend(tokenizer.eos_id());
    eos
}
