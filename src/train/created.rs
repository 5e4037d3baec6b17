//! Created models (smoke and mini scales): a model directory made from the manifest's
//! `model.init` (random weights, a tokenizer, the warm start), cached by fingerprint.

use crate::files::AtPath;
use std::path::Path;

use serde::Serialize;

use super::{warm_start, Event, Result, TrainError};
use crate::data;
use crate::manifest::Experiment;
use crate::model::tokenizer::Tokenizer;
use crate::model::{self, init, Params, QwenConfig};
use crate::run::lock;
use crate::run::provenance::{now_unix, utc};

/// What created a model directory (`init.json` beside the weights): the fingerprint of its
/// `model.init` and, with a warm start, what the fine-tune did.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct InitRecord {
    pub fingerprint: String,
    pub init: serde_json::Value,
    pub parameters: usize,
    pub tokenizer_vocab: Option<usize>,
    pub warm_start: Option<serde_json::Value>,
    pub created_utc: String,
}

/// SHA-256 over what determines a created model: the config file's JSON, seed, tokenizer,
/// warm start and the synthetic task's version. Paths do not count.
pub fn init_fingerprint(init: &crate::model::init::ModelInitSpec) -> Result<String> {
    let text = crate::files::read_to_string(&init.config).at(&init.config)?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| TrainError::Json {
            path: init.config.clone(),
            source,
        })?;
    // A real tokenizer counts by its files' contents, not where they are.
    let tokenizer = match &init.tokenizer {
        Some(crate::model::init::InitTokenizer::Files(files)) => {
            let dir = init::tokenizer_dir(files)?;
            let mut digest = <sha2::Sha256 as sha2::Digest>::new();
            for f in init::TOKENIZER_FILES {
                let bytes = crate::files::read(dir.join(f)).at(dir.join(f))?;
                sha2::Digest::update(&mut digest, &bytes);
            }
            serde_json::json!({
                "files_sha256": crate::checksum::hex(&sha2::Digest::finalize(digest))
            })
        }
        other => serde_json::to_value(other).expect("invariant: a tokenizer kind is JSON"),
    };
    let key = serde_json::json!({
        "config": config, "seed": init.seed, "tokenizer": tokenizer,
        "warm_start": init.warm_start, "synthetic": data::synthetic::VERSION,
    });
    Ok(crate::checksum::hex(
        &<sha2::Sha256 as sha2::Digest>::digest(key.to_string().as_bytes()),
    ))
}

/// Creates a missing model directory from the manifest's `model.init` (smoke and mini scales):
/// random weights, a tokenizer, then the warm start. It is built under a temporary name and
/// renamed when complete, so an interrupted build is never mistaken for a model. An existing
/// directory is reused only if its `init.json` has this manifest's fingerprint and its files
/// match their SHA256SUMS: a cache keyed by fingerprint, checked on every use.
pub fn ensure_model(exp: &Experiment, mut on_event: impl FnMut(Event<'_>)) -> Result<()> {
    let (dir, init) = match (&exp.model.source, &exp.model.init) {
        (crate::hub::ModelSource::Dir(dir), Some(init)) => (dir, init),
        _ => return Ok(()),
    };
    let fp = init_fingerprint(init)?;
    // Runs side by side that share this model wait for the one creating it, then check it.
    let _lock = lock::acquire(dir, lock::Wait::Block).at(lock::path_for(dir))?;
    if dir.exists() {
        return check_created_model(dir, &fp);
    }
    let name = dir
        .file_name()
        .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.with_file_name(format!("{name}.partial"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).at(&tmp)?;
    }
    let params = init::write_random_model(&init.config, &tmp, init.seed)?;
    let cfg = QwenConfig::load(&tmp.join("config.json"))?;
    let tokenizer_vocab = match &init.tokenizer {
        None => None,
        Some(kind) => Some(init::write_tokenizer(
            kind,
            &tmp,
            cfg.vocab_size,
            &init.config,
        )?),
    };
    let warm = match &init.warm_start {
        None => None,
        Some(spec) => {
            let device = model::device(exp.device)?;
            let tokenizer = Tokenizer::load(&tmp)?;
            // the warm start trains: fp32 masters, the manifest's dtype for the arithmetic
            let precision = model::Precision::training(exp.model.dtype);
            let params =
                Params::load_dir(&tmp, precision.master, &device)?.with_compute(precision.compute);
            let report = warm_start::warm_start(
                &cfg,
                &params,
                &tokenizer,
                spec,
                init.seed,
                &device,
                |step, total, loss| on_event(Event::WarmStart { step, total, loss }),
            )?;
            init::save_model(&cfg, &params, &tmp)?;
            Some(serde_json::to_value(&report).expect("invariant: a warm-start report is JSON"))
        }
    };
    let record = InitRecord {
        fingerprint: fp,
        init: serde_json::to_value(init).expect("invariant: a model.init is JSON"),
        parameters: params.count(),
        tokenizer_vocab,
        warm_start: warm,
        created_utc: utc(now_unix()),
    };
    let json = serde_json::to_string(&record).expect("invariant: an init record is JSON");
    crate::atomic::write(&tmp.join("init.json"), json.as_bytes())?;
    crate::archive::write_sums(&tmp)?;
    Ok(crate::atomic::commit(&tmp, dir).at(dir)?)
}

fn check_created_model(dir: &Path, fp: &str) -> Result<()> {
    let path = dir.join("init.json");
    let record: InitRecord = match crate::files::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|source| TrainError::Json {
            path: path.clone(),
            source,
        })?,
        Err(_) => {
            return Err(TrainError::NotCreated {
                dir: dir.to_owned(),
            })
        }
    };
    if record.fingerprint != fp {
        return Err(TrainError::OtherInit {
            dir: dir.to_owned(),
            found: record.fingerprint[..12.min(record.fingerprint.len())].to_string(),
            want: fp[..12].to_string(),
        });
    }
    let report = crate::archive::verify_dir(dir)?;
    if !report.ok() {
        return Err(TrainError::ModelChanged {
            dir: dir.to_owned(),
            report: report.describe(),
        });
    }
    Ok(())
}
