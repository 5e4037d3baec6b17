//! `acpo model export`: a model directory that `transformers` loads whole, weights and tokenizer
//! (`AutoModelForCausalLM.from_pretrained(dir)`, `AutoTokenizer.from_pretrained(dir)`).
//!
//! A checkpoint's `policy/` holds only `config.json` and `model.safetensors`; the tokenizer is
//! the run's model's (the manifest's `model`). The export puts both in one directory with a
//! `generation_config.json`: the EOS ids the harness stops at (the config's and the
//! tokenizer's), the padding id, and the paper's sampling (temperature 1, top-p 1, no top-k).
//!
//! A tokenizer whose `tokenizer_config.json` names no `tokenizer_class` (the char and BPE
//! tokenizers of the smoke and mini scales) is given `PreTrainedTokenizerFast`, the class that
//! reads `tokenizer.json` as written: left to itself, `transformers` picks the class from the
//! config's `model_type` (Qwen2Tokenizer for qwen3), which replaces the pre-tokenizer with
//! Qwen's own, and the text would no longer tokenize as it did in training.
//!
//! The directory is staged beside `out` and put in place complete ([`crate::atomic`]); an
//! existing `out` is refused, never overwritten, including one that appeared while the files
//! were copied (the staged directory is put in place by a rename that refuses an existing
//! target). What is copied is read as regular files only.

use std::path::{Path, PathBuf};

use super::RunDir;
use crate::files::{AtPath, PathIoError};
use crate::model::tokenizer::Tokenizer;
use crate::model::QwenConfig;

/// Files of a tokenizer that `transformers` reads, copied when the source has them
/// (`tokenizer.json` is required).
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
];

/// The tokenizer class given to a `tokenizer_config.json` that names none.
pub const DEFAULT_TOKENIZER_CLASS: &str = "PreTrainedTokenizerFast";

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{}: {reason}", path.display())]
    Source { path: PathBuf, reason: String },
    #[error("{}: already exists; the export writes a new directory (remove it or name another --out)", path.display())]
    Exists { path: PathBuf },
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error(transparent)]
    Io(#[from] PathIoError),
}

type Result<T> = std::result::Result<T, ExportError>;

/// What an export wrote, for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub out: PathBuf,
    /// Where the weights came from (a model directory or a checkpoint's `policy/`).
    pub weights: PathBuf,
    /// Where the tokenizer came from.
    pub tokenizer: PathBuf,
    pub files: Vec<String>,
}

impl std::fmt::Display for Exported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wrote {} ({}): weights from {}, tokenizer from {}",
            self.out.display(),
            self.files.join(", "),
            self.weights.display(),
            self.tokenizer.display()
        )
    }
}

/// Where the weights and the tokenizer of `source` are: a run directory (its checkpoint of
/// `step`, else its latest, and its manifest's model's tokenizer) or a model directory (both
/// from it); `tokenizer_from` overrides the tokenizer's directory.
pub fn locate(
    source: &Path,
    step: Option<usize>,
    tokenizer_from: Option<&Path>,
    hub: &crate::hub::HubOptions,
) -> Result<(PathBuf, PathBuf)> {
    let run = RunDir::at(source);
    let (weights, tokenizer) = if run.manifest().is_file() {
        let ckpt = match step {
            Some(s) => {
                let c = run.checkpoint(s);
                if !c.state().is_file() {
                    return Err(ExportError::Source {
                        path: c.path().to_owned(),
                        reason: format!("the run has no complete checkpoint of step {s}"),
                    });
                }
                c
            }
            None => match run.latest_checkpoint().at(run.checkpoints())? {
                Some((_, c)) => c,
                None => {
                    return Err(ExportError::Source {
                        path: run.checkpoints(),
                        reason: "the run has no complete checkpoint to export".into(),
                    })
                }
            },
        };
        let tokenizer = match tokenizer_from {
            Some(dir) => dir.to_owned(),
            None => {
                // a run's manifest.yaml is named by the run, not by the experiment: read as
                // text (Experiment::load checks the file's name against the manifest's)
                let path = run.manifest();
                let text = crate::files::read_to_string(&path).at(&path)?;
                let exp = crate::manifest::Experiment::from_yaml(&text, &path)?;
                crate::hub::resolve(&exp.model.source, hub)
                    .map_err(crate::model::ModelError::from)?
            }
        };
        (ckpt.policy(), tokenizer)
    } else {
        if step.is_some() {
            return Err(ExportError::Source {
                path: run.manifest(),
                reason: "--step needs a run directory (one holding manifest.yaml)".into(),
            });
        }
        let tokenizer = tokenizer_from.unwrap_or(source).to_owned();
        (source.to_owned(), tokenizer)
    };
    Ok((weights, tokenizer))
}

/// The safetensors files of a model directory: `model.safetensors`, or the index and the shards
/// it names.
fn weight_files(dir: &Path) -> Result<Vec<String>> {
    if dir.join("model.safetensors").is_file() {
        return Ok(vec!["model.safetensors".into()]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(ExportError::Source {
            path: dir.to_owned(),
            reason: "no model.safetensors nor model.safetensors.index.json".into(),
        });
    }
    let text = crate::files::read_to_string(&index).at(&index)?;
    let bad = |reason: String| ExportError::Source {
        path: index.clone(),
        reason,
    };
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut files = vec!["model.safetensors.index.json".to_string()];
    for v in map.values() {
        let f = v
            .as_str()
            .ok_or_else(|| bad("a weight_map value is not a file name".into()))?;
        // a shard is a file beside the index, never a path out of the directory
        if f.contains('/') || f.contains('\\') || f.starts_with('.') || !f.ends_with(".safetensors")
        {
            return Err(bad(format!("shard {f:?} is not a .safetensors file name")));
        }
        if !files.iter().any(|g| g == f) {
            files.push(f.to_string());
        }
    }
    Ok(files)
}

/// `tokenizer_config.json` as exported: the source's, with [`DEFAULT_TOKENIZER_CLASS`] where
/// it names no class.
fn tokenizer_config(path: &Path) -> Result<Vec<u8>> {
    let bytes = crate::files::read(path).at(path)?;
    let mut json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| ExportError::Source {
            path: path.to_owned(),
            reason: format!("not JSON: {e}"),
        })?;
    let Some(obj) = json.as_object_mut() else {
        return Err(ExportError::Source {
            path: path.to_owned(),
            reason: "not a JSON object".into(),
        });
    };
    if obj.contains_key("tokenizer_class") {
        return Ok(bytes);
    }
    obj.insert(
        "tokenizer_class".into(),
        DEFAULT_TOKENIZER_CLASS.to_string().into(),
    );
    Ok(serde_json::to_string_pretty(&json)
        .expect("invariant: JSON values serialise")
        .into_bytes())
}

/// `generation_config.json`: the ids generation stops at and pads with, and the paper's
/// sampling (temperature 1, top-p 1, top-k off).
pub fn generation_config(cfg: &QwenConfig, tokenizer: &Tokenizer) -> serde_json::Value {
    let eos = crate::model::load::eos_ids(cfg, tokenizer);
    let mut unique: Vec<u32> = Vec::new();
    for id in eos {
        if !unique.contains(&id) {
            unique.push(id);
        }
    }
    let eos = match unique.as_slice() {
        [one] => serde_json::json!(one),
        many => serde_json::json!(many),
    };
    let mut g = serde_json::json!({
        "eos_token_id": eos,
        "pad_token_id": tokenizer.pad_id(),
        "do_sample": true,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
    });
    if let Some(bos) = cfg.raw.get("bos_token_id").filter(|v| v.is_u64()) {
        g["bos_token_id"] = bos.clone();
    }
    g
}

/// Puts the staged export at `out`. `out` was checked at the start; what appeared there since
/// (during the copy) is refused all the same and left as it is.
fn put_in_place(stage: crate::atomic::StagedDir, out: &Path) -> Result<()> {
    match stage.commit_new(out) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(ExportError::Exists {
            path: out.to_owned(),
        }),
        r => Ok(r.at(out)?),
    }
}

/// Exports `source` ([`locate`]) into the new directory `out`.
pub fn export(
    source: &Path,
    step: Option<usize>,
    tokenizer_from: Option<&Path>,
    out: &Path,
    hub: &crate::hub::HubOptions,
) -> Result<Exported> {
    if std::fs::symlink_metadata(out).is_ok() {
        return Err(ExportError::Exists {
            path: out.to_owned(),
        });
    }
    let (weights, tok_dir) = locate(source, step, tokenizer_from, hub)?;
    // both are read as the harness reads them: a config or tokenizer it refuses is not exported
    let cfg = QwenConfig::load(&weights.join("config.json"))?;
    if !tok_dir.join("tokenizer.json").is_file() {
        return Err(ExportError::Source {
            path: tok_dir.join("tokenizer.json"),
            reason: "not found: the tokenizer's directory (--tokenizer-from) holds tokenizer.json"
                .into(),
        });
    }
    let tokenizer = Tokenizer::load(&tok_dir)?;
    let weight_files = weight_files(&weights)?;
    let stage = crate::atomic::StagedDir::new(out, "export").at(out)?;
    let mut files = Vec::new();
    // read as a regular file only: a pipe named by the index would never end
    let copy = |from: &Path, name: &str| -> Result<()> {
        let mut src = crate::files::open(from).at(from)?;
        let to = stage.path().join(name);
        let mut dst = std::fs::File::create_new(&to).at(&to)?;
        std::io::copy(&mut src, &mut dst).at(from)?;
        Ok(())
    };
    for f in std::iter::once("config.json".to_string()).chain(weight_files) {
        copy(&weights.join(&f), &f)?;
        files.push(f);
    }
    for f in TOKENIZER_FILES {
        let from = tok_dir.join(f);
        if !from.is_file() {
            continue;
        }
        if f == "tokenizer_config.json" {
            crate::atomic::write(&stage.path().join(f), &tokenizer_config(&from)?)?;
        } else {
            copy(&from, f)?;
        }
        files.push(f.to_string());
    }
    let g = serde_json::to_string_pretty(&generation_config(&cfg, &tokenizer))
        .expect("invariant: JSON values serialise");
    crate::atomic::write(&stage.path().join("generation_config.json"), g.as_bytes())?;
    files.push("generation_config.json".into());
    put_in_place(stage, out)?;
    Ok(Exported {
        out: out.to_owned(),
        weights,
        tokenizer: tok_dir,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_that_appeared_during_the_copy_is_refused_and_left_as_it_is() {
        let tmp = tempfile::tempdir().expect("tmp");
        let out = tmp.path().join("out");
        let stage = crate::atomic::StagedDir::new(&out, "export").expect("stage");
        std::fs::write(stage.path().join("model.safetensors"), b"ours").expect("write");
        let staged = stage.path().to_owned();
        // another process makes `out` after the check at the start of the export
        std::fs::create_dir(&out).expect("mkdir");
        std::fs::write(out.join("theirs"), b"theirs").expect("write");
        let err = put_in_place(stage, &out).expect_err("refused");
        assert!(matches!(err, ExportError::Exists { .. }), "{err}");
        assert!(err.to_string().contains("already exists"), "{err}");
        assert_eq!(std::fs::read(out.join("theirs")).expect("kept"), b"theirs");
        assert!(!out.join("model.safetensors").exists());
        assert!(!staged.exists(), "the staged export is removed");
    }
}
