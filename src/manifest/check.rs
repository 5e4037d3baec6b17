//! `acpo check`: every manifest under some paths validated, run names unique, each one's model
//! config (where it is on this machine) one `train` would take.

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};

use super::{Experiment, ManifestError};

/// What `acpo check` found: a summary line per valid manifest, an error per invalid one.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub files: usize,
    pub valid: Vec<String>,
    pub errors: Vec<String>,
}

impl Experiment {
    /// Checks the model config this manifest names on this machine (a model directory's
    /// config.json, or the config a missing one is created from), so that `acpo check` and the
    /// start of `train` refuse the sizes model init would, naming the field (issue #35); then
    /// the memory the manifest's counts take at least, with that model where it is known
    /// ([`Experiment::check_memory`]).
    pub fn check_model_config(&self) -> Result<(), String> {
        let config = match (&self.model.source, &self.model.init) {
            (crate::hub::ModelSource::Dir(dir), _) if dir.join("config.json").is_file() => {
                Some(("model.dir", dir.join("config.json")))
            }
            (crate::hub::ModelSource::Dir(_), Some(init)) => {
                Some(("model.init.config", init.config.clone()))
            }
            _ => None,
        };
        let cfg = match config {
            Some((field, config)) => Some(
                crate::model::QwenConfig::load(&config)
                    .map_err(|e| format!("field `{field}`: {e}"))?,
            ),
            None => None,
        };
        self.check_memory(cfg.as_ref())
    }
}

/// Validates every manifest under `paths` (files, or directories searched for `*.yaml`);
/// run names must be unique across them, and each manifest's model config, where it is on this
/// machine, must be one `train` would take. Every file is checked, whatever the others say.
pub fn check_all(paths: &[PathBuf]) -> Result<CheckReport, ManifestError> {
    let mut files = Vec::new();
    for path in paths {
        files.extend(discover(path)?);
    }
    let mut report = CheckReport {
        files: files.len(),
        ..CheckReport::default()
    };
    let mut names: std::collections::BTreeMap<String, PathBuf> = Default::default();
    for file in &files {
        match Experiment::load(file) {
            Ok(experiment) => {
                if let Some(other) = names.insert(experiment.name.clone(), file.clone()) {
                    report.errors.push(format!(
                        "{}: field `name`: `{}` is already the name of {}",
                        file.display(),
                        experiment.name,
                        other.display()
                    ));
                    continue;
                }
                if let Err(reason) = experiment.check_model_config() {
                    report.errors.push(format!("{}: {reason}", file.display()));
                    continue;
                }
                report.valid.push(experiment.summary());
            }
            Err(err) => report.errors.push(err.to_string()),
        }
    }
    Ok(report)
}

/// Every `*.yaml` / `*.yml` file under `path` (or `path` itself), sorted for a stable order.
pub fn discover(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let meta = crate::files::metadata(path)?;
    if meta.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    if !meta.is_dir() {
        return Err(PathIoError::refused(
            path,
            std::io::ErrorKind::InvalidInput,
            crate::files::NOT_REGULAR,
        )
        .into());
    }
    let mut found = Vec::new();
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).at(&dir)?;
        for entry in entries {
            let entry = entry.at(&dir)?;
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                found.push(p);
            }
        }
    }
    found.sort();
    Ok(found)
}
