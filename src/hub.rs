//! The Hugging Face hub: a model's files (a local directory, or a hub repository at a pinned
//! revision) and dataset files, fetched into (or, offline, read from) the standard HF cache.
//!
//! The cache layout is the one `huggingface_hub` writes (`<cache>/models--owner--name/refs/<rev>`
//! holding a commit hash, `snapshots/<hash>/<files>`), so a cache filled by Python tools is reused.
//! `HF_HUB_OFFLINE=1` never touches the network. A revision that is itself a commit hash is
//! looked up as `snapshots/<hash>` directly.

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};

use serde::Serialize;

use hf_hub::{Cache, Repo, RepoType};

/// Why a hub repository (or a local model directory standing in for one) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("hub {repo}@{revision}: {reason}")]
    Hub {
        repo: String,
        revision: String,
        reason: String,
    },
    #[error("{path}: not found in the model directory")]
    Missing { path: PathBuf },
    #[error(transparent)]
    Io(#[from] PathIoError),
}

pub type Result<T> = std::result::Result<T, HubError>;

/// Files a model directory needs; the weights are found separately (single or sharded).
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
const OPTIONAL: [&str; 2] = ["tokenizer_config.json", "generation_config.json"];
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// Where a model's files are: a hub revision (through the cache) or a local directory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum ModelSource {
    Hub { repo: String, revision: String },
    Dir(PathBuf),
}

impl ModelSource {
    /// The model's name: the hub repo's (`Qwen/Qwen3-1.7B` → `Qwen3-1.7B`), or the model
    /// directory's.
    pub fn label(&self) -> String {
        match self {
            ModelSource::Hub { repo, .. } => repo.rsplit('/').next().unwrap_or(repo).to_string(),
            ModelSource::Dir(d) => d.file_name().map_or_else(
                || d.display().to_string(),
                |n| n.to_string_lossy().to_string(),
            ),
        }
    }
}

#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The hub cache directory (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub).
    pub cache_dir: PathBuf,
    /// Read only the cache (`HF_HUB_OFFLINE`).
    pub offline: bool,
}

impl HubOptions {
    pub fn from_env() -> HubOptions {
        let cache_dir = std::env::var_os("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| Cache::from_env().path().clone());
        let offline = std::env::var("HF_HUB_OFFLINE")
            .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
            .unwrap_or(false);
        HubOptions { cache_dir, offline }
    }
}

/// A directory holding the model's files. `Dir` sources are checked, hub sources resolved
/// through the cache (downloading what is missing unless offline).
pub fn resolve(source: &ModelSource, opts: &HubOptions) -> Result<PathBuf> {
    match source {
        ModelSource::Dir(dir) => {
            for f in REQUIRED {
                if !dir.join(f).exists() {
                    return Err(HubError::Missing { path: dir.join(f) });
                }
            }
            Ok(dir.clone())
        }
        ModelSource::Hub { repo, revision } => {
            if opts.offline {
                from_cache(repo, revision, &opts.cache_dir)
            } else {
                download(repo, revision, &opts.cache_dir)
            }
        }
    }
}

fn hub_error(repo: &str, revision: &str, reason: impl Into<String>) -> HubError {
    HubError::Hub {
        repo: repo.into(),
        revision: revision.into(),
        reason: reason.into(),
    }
}

fn from_cache(repo: &str, revision: &str, cache_dir: &Path) -> Result<PathBuf> {
    let hub_repo = Repo::with_revision(repo.into(), RepoType::Model, revision.into());
    let snapshot = {
        let by_ref = Cache::new(cache_dir.to_owned())
            .repo(hub_repo.clone())
            .get("config.json");
        let by_hash = cache_dir
            .join(hub_repo.folder_name())
            .join("snapshots")
            .join(revision)
            .join("config.json");
        match by_ref {
            Some(p) => p,
            None if by_hash.exists() => by_hash,
            None => {
                return Err(hub_error(
                    repo,
                    revision,
                    format!(
                        "not in the offline cache {} (HF_HUB_OFFLINE is set): download it once online, or point model.dir at a local copy",
                        cache_dir.display()
                    ),
                ))
            }
        }
    };
    let dir = snapshot
        .parent()
        .expect("invariant: a cached file has a parent")
        .to_owned();
    check_complete(&dir).map_err(|reason| hub_error(repo, revision, reason))?;
    Ok(dir)
}

fn check_complete(dir: &Path) -> std::result::Result<(), String> {
    for f in REQUIRED {
        if !dir.join(f).exists() {
            return Err(format!("cached snapshot {} lacks {f}", dir.display()));
        }
    }
    if !dir.join(INDEX).exists() && !dir.join(SINGLE).exists() {
        return Err(format!(
            "cached snapshot {} has no {SINGLE} or {INDEX}",
            dir.display()
        ));
    }
    Ok(())
}

fn download(repo: &str, revision: &str, cache_dir: &Path) -> Result<PathBuf> {
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_cache_dir(cache_dir.to_owned())
        .build()
        .map_err(|e| hub_error(repo, revision, e.to_string()))?;
    let r = api.repo(Repo::with_revision(
        repo.into(),
        RepoType::Model,
        revision.into(),
    ));
    let get = |f: &str| {
        r.get(f)
            .map_err(|e| hub_error(repo, revision, format!("{f}: {e}")))
    };
    let config = get("config.json")?;
    for f in REQUIRED.iter().skip(1) {
        get(f)?;
    }
    for f in OPTIONAL {
        let _ = r.get(f); // absent in some repos
    }
    match r.get(INDEX) {
        Ok(index) => {
            let text = crate::files::read_to_string(&index).at(&index)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| hub_error(repo, revision, format!("{INDEX}: {e}")))?;
            let mut shards: Vec<String> = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| {
                    m.values()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            shards.sort();
            shards.dedup();
            for s in shards {
                get(&s)?;
            }
        }
        Err(_) => {
            get(SINGLE)?;
        }
    }
    Ok(config
        .parent()
        .expect("invariant: a cached file has a parent")
        .to_owned())
}

/// The directory holding a hub model's `tokenizer.json` and `tokenizer_config.json` (from the
/// cache, downloaded unless offline): its tokenizer without its weights.
pub fn tokenizer_files(repo: &str, revision: &str, opts: &HubOptions) -> Result<PathBuf> {
    const FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];
    let hub_repo = Repo::with_revision(repo.into(), RepoType::Model, revision.into());
    let mut found = Vec::new();
    for f in FILES {
        let path = if opts.offline {
            Cache::new(opts.cache_dir.clone())
                .repo(hub_repo.clone())
                .get(f)
                .ok_or_else(|| {
                    hub_error(
                        repo,
                        revision,
                        format!(
                            "{f} is not in the offline cache {} (HF_HUB_OFFLINE is set)",
                            opts.cache_dir.display()
                        ),
                    )
                })?
        } else {
            hf_hub::api::sync::ApiBuilder::from_env()
                .with_cache_dir(opts.cache_dir.clone())
                .build()
                .map_err(|e| hub_error(repo, revision, e.to_string()))?
                .repo(hub_repo.clone())
                .get(f)
                .map_err(|e| hub_error(repo, revision, format!("{f}: {e}")))?
        };
        found.push(path);
    }
    Ok(found[0]
        .parent()
        .expect("invariant: a cached file has a parent")
        .to_owned())
}

/// A dataset file from the hub cache (downloaded unless offline).
pub fn dataset_file(repo: &str, file: &str, opts: &HubOptions) -> Result<PathBuf> {
    let hub_repo = Repo::with_revision(repo.into(), RepoType::Dataset, "main".into());
    if opts.offline {
        return Cache::new(opts.cache_dir.clone())
            .repo(hub_repo)
            .get(file)
            .ok_or_else(|| {
                hub_error(
                    repo,
                    "main",
                    format!(
                        "{file} is not in the offline cache {}",
                        opts.cache_dir.display()
                    ),
                )
            });
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_cache_dir(opts.cache_dir.clone())
        .build()
        .map_err(|e| hub_error(repo, "main", e.to_string()))?;
    api.repo(hub_repo)
        .get(file)
        .map_err(|e| hub_error(repo, "main", format!("{file}: {e}")))
}
