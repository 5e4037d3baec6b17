//! The one model loader: train, eval, generate and the benchmarks get their model here, with
//! one device and dtype policy ([`super::device`], [`super::dtype`]).

use std::path::PathBuf;

use candle_core::Device;

use super::tokenizer::Tokenizer;
use super::{Params, Precision, QwenConfig, Result};
use crate::hub::ModelSource;
use crate::hub::{self, HubOptions};

/// A model's files, config, tokenizer and weights on their device.
pub struct LoadedModel {
    pub dir: PathBuf,
    pub cfg: QwenConfig,
    pub tokenizer: Tokenizer,
    pub params: Params,
    pub device: Device,
}

/// Resolves `source` (a directory, or a hub revision through the cache) and loads it on the
/// device a manifest names, with masters and arithmetic in the dtypes of `precision`.
pub fn load(
    source: &ModelSource,
    hub: &HubOptions,
    device: crate::model::spec::Device,
    precision: Precision,
) -> Result<LoadedModel> {
    let dir = hub::resolve(source, hub)?;
    let cfg = QwenConfig::load(&dir.join("config.json"))?;
    let tokenizer = Tokenizer::load(&dir)?;
    let device = super::device(device)?;
    let params = Params::load_dir(&dir, precision.master, &device)?.with_compute(precision.compute);
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
