//! Whether a folder of finished runs holds every run a report expects, each complete (issue
//! #47): the one check `reproduce --from` and `sweep --from` make before they report. An archive
//! can be resealed after a run was removed or cut short (its checksums then agree), so the runs
//! are checked against what their manifests say a finished run holds, never against the sums
//! alone: a report over 19 of 20 seeds, or 3 of 4 pairs, must not come out as if it were whole.
//!
//! A run is found by the fingerprint of the manifest its directory holds (its directory's name
//! can be anything), and it is complete when
//! - it was sealed after its last step ([`RunDir::is_sealed`]: provenance.json says when it
//!   finished, SHA256SUMS is there);
//! - `metrics.jsonl` holds one line per training step, 1 to `trainer.total_steps`, in order;
//! - `eval.jsonl` holds one evaluation per step of the manifest's schedule
//!   ([`crate::manifest::TrainerSpec::evaluates_at`]), in order.

use crate::files::{AtPath, PathIoError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{line_step, RunDir};
use crate::manifest::{Experiment, ManifestError};

#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    #[error("{}: {count} of the {expected} runs the report expects are not there (the first: {first}); a report from the others would stand on fewer runs than it says", root.display())]
    Missing {
        root: PathBuf,
        count: usize,
        expected: usize,
        first: String,
    },
    #[error("{}: not a complete run: {reason}; a report from it would stand on less than its manifest says", dir.display())]
    Incomplete { dir: PathBuf, reason: String },
    #[error("{}: holds {count} runs the report does not expect (the first: {first}), and the report reads every run there", root.display())]
    Unexpected {
        root: PathBuf,
        count: usize,
        first: String,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Io(#[from] PathIoError),
}

type Result<T> = std::result::Result<T, RunsError>;

/// A run directory of a folder, with the manifest it holds.
#[derive(Debug, Clone)]
pub struct Found {
    pub dir: PathBuf,
    pub exp: Experiment,
}

/// Every run directory directly under `root` (one holding a `manifest.yaml`), by name; a
/// manifest that does not parse is an error naming it.
pub fn runs_in(root: &Path) -> Result<Vec<Found>> {
    let dirs = crate::files::subdirs(root)?;
    let mut out = Vec::new();
    for dir in dirs {
        let manifest = RunDir::at(&dir).manifest();
        if !manifest.exists() {
            continue;
        }
        let text = crate::files::read_to_string(&manifest).at(&manifest)?;
        let exp = Experiment::from_yaml(&text, &manifest)?;
        out.push(Found { dir, exp });
    }
    Ok(out)
}

/// Why `run` is not a complete run of `exp` ([module docs](self)), or None.
pub fn gap(run: &RunDir, exp: &Experiment) -> Option<String> {
    if !run.is_sealed() {
        return Some(
            "not sealed (provenance.json has no finish time, or SHA256SUMS is missing): it was cut short".into(),
        );
    }
    let total = exp.trainer.total_steps;
    if let Some(why) = steps_gap(&run.metrics(), 1..=total, "training step") {
        return Some(why);
    }
    steps_gap(&run.eval(), exp.trainer.eval_steps(), "evaluation")
}

/// Why the lines of the JSONL file `path` are not one per step of `expected`, in order.
fn steps_gap(path: &Path, expected: impl Iterator<Item = usize>, what: &str) -> Option<String> {
    let name = path.file_name().map_or("?".into(), |n| n.to_string_lossy());
    let text = match crate::files::read_to_string(path) {
        Ok(text) => text,
        Err(e) => return Some(format!("{name}: {e}")),
    };
    let mut lines = text.lines().enumerate();
    let mut held = 0;
    for want in expected {
        let Some((i, line)) = lines.next() else {
            return Some(format!(
                "{name} holds {held} lines and no {what} at step {want} (the manifest plans it)"
            ));
        };
        match line_step(line) {
            Some(step) if step == want => held += 1,
            Some(step) => {
                return Some(format!(
                    "{name}, line {}: step {step} where the manifest's next {what} is step {want}",
                    i + 1
                ))
            }
            None => return Some(format!("{name}, line {}: no step", i + 1)),
        }
    }
    lines.next().map(|(i, _)| {
        format!(
            "{name}, line {}: more {what}s than the manifest plans ({held})",
            i + 1
        )
    })
}

/// What to do with runs of the folder that no expected run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Others {
    /// Left alone: the report reads only the expected runs (a sweep's, by fingerprint).
    Ignored,
    /// Refused: the report reads every run of the folder (Table 1 and its kin).
    Refused,
}

/// Finds each of `expected` among the runs directly under `root` by its fingerprint, and checks
/// that each is complete ([`gap`]); with [`Others::Refused`], `root` must hold no other run.
/// Returns each expected run's directory by fingerprint.
pub fn expect(
    expected: &[&Experiment],
    root: &Path,
    others: Others,
) -> Result<BTreeMap<String, PathBuf>> {
    let found = runs_in(root)?;
    let mut by_fingerprint: BTreeMap<String, &Found> = BTreeMap::new();
    for f in &found {
        by_fingerprint.entry(f.exp.fingerprint()).or_insert(f);
    }
    let mut out = BTreeMap::new();
    let mut missing = Vec::new();
    for exp in expected {
        let fingerprint = exp.fingerprint();
        match by_fingerprint.get(&fingerprint) {
            Some(f) => {
                if let Some(reason) = gap(&RunDir::at(&f.dir), &f.exp) {
                    return Err(RunsError::Incomplete {
                        dir: f.dir.clone(),
                        reason,
                    });
                }
                out.insert(fingerprint, f.dir.clone());
            }
            None => missing.push(RunDir::name_of(exp)),
        }
    }
    if let Some(first) = missing.first() {
        return Err(RunsError::Missing {
            root: root.to_owned(),
            count: missing.len(),
            expected: expected.len(),
            first: first.clone(),
        });
    }
    let kept: std::collections::HashSet<&PathBuf> = out.values().collect();
    let unexpected: Vec<&Found> = found.iter().filter(|f| !kept.contains(&f.dir)).collect();
    if let (Others::Refused, Some(first)) = (others, unexpected.first()) {
        return Err(RunsError::Unexpected {
            root: root.to_owned(),
            count: unexpected.len(),
            first: first.dir.file_name().map_or_else(
                || first.dir.display().to_string(),
                |n| n.to_string_lossy().into(),
            ),
        });
    }
    Ok(out)
}
