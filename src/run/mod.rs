//! The run directory: what `train` writes, what `report` and `archive` read (docs/ARCHITECTURE.md).
//!
//! `<results>/<scale>/<name>-<fingerprint12>/` holds `manifest.yaml`, `fingerprint`,
//! `provenance.json`, `metrics.jsonl` (one line per step, verl's metric names), `eval.jsonl` (one
//! [`crate::eval::EvalSummary`] per evaluation), `tails/step_NNNNNN.json` (r·Â histograms),
//! `checkpoints/step_NNNNNN/` and `SHA256SUMS`. [`RunDir`] is the one place these names are
//! spelled. Every file is written atomically; a checkpoint directory appears only when complete.

pub mod complete;
pub mod export;
pub mod lock;
pub mod provenance;
pub mod tails;

use std::path::{Path, PathBuf};

use crate::manifest::Experiment;

pub use provenance::Provenance;

/// The names of the metrics (verl's) that are read back from `metrics.jsonl`: by the report,
/// the progress display and resume. The trainer writes every metric under its name in
/// `train::metrics`, using these where they apply; a clipping rule's own metrics are named by the
/// rule (`algo::clip`).
pub mod metric {
    pub const STEP: &str = "training/global_step";
    pub const ACC: &str = "reward/acc/mean";
    pub const RESPONSE_LENGTH: &str = "response_length/mean";
    pub const PG_LOSS: &str = "actor/pg_loss";
    pub const ENTROPY: &str = "actor/entropy";
    pub const ACTOR_GRAD_NORM: &str = "actor/grad_norm";
    pub const CRITIC_GRAD_NORM: &str = "critic/grad_norm";
    pub const STEP_SECONDS: &str = "timing_s/step";
}

/// A run directory and the names of everything in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// The run directory of `exp` under the results root.
    pub fn of(exp: &Experiment, results: &Path) -> RunDir {
        RunDir {
            root: results.join(exp.scale.name()).join(RunDir::name_of(exp)),
        }
    }

    /// The directory's own name, `<name>-<fingerprint>`: what archives keep of it.
    pub fn name_of(exp: &Experiment) -> String {
        format!("{}-{}", exp.name, exp.short_fingerprint())
    }

    /// An existing directory read as a run directory.
    pub fn at(root: impl Into<PathBuf>) -> RunDir {
        RunDir { root: root.into() }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn manifest(&self) -> PathBuf {
        self.root.join("manifest.yaml")
    }

    pub fn fingerprint(&self) -> PathBuf {
        self.root.join("fingerprint")
    }

    pub fn provenance(&self) -> PathBuf {
        self.root.join("provenance.json")
    }

    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    pub fn eval(&self) -> PathBuf {
        self.root.join("eval.jsonl")
    }

    pub fn tails_dir(&self) -> PathBuf {
        self.root.join("tails")
    }

    /// The r·Â histograms of one step.
    pub fn tails(&self, step: usize) -> PathBuf {
        self.tails_dir().join(format!("step_{step:06}.json"))
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// The checkpoint of `step` (complete when it exists).
    pub fn checkpoint(&self, step: usize) -> Checkpoint {
        Checkpoint(self.checkpoints().join(format!("step_{step:06}")))
    }

    /// Whether the run was sealed after its last step: provenance says when it finished and
    /// `SHA256SUMS` was written after that. A run killed in between is not finished.
    pub fn is_sealed(&self) -> bool {
        let finished = crate::files::read(self.provenance())
            .ok()
            .and_then(|b| serde_json::from_slice::<Provenance>(&b).ok())
            .is_some_and(|p| p.finished_unix.is_some());
        finished && self.root.join(crate::checksum::SUMS).is_file()
    }

    /// The newest complete checkpoint (`step_NNNNNN` with its `state.json`, never a `.tmp`).
    pub fn latest_checkpoint(&self) -> std::io::Result<Option<(usize, Checkpoint)>> {
        let dir = self.checkpoints();
        if !dir.exists() {
            return Ok(None);
        }
        let mut best: Option<(usize, Checkpoint)> = None;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            let Some(n) = name
                .strip_prefix("step_")
                .and_then(|s| s.parse::<usize>().ok())
            else {
                continue;
            };
            let ckpt = Checkpoint(entry.path());
            if ckpt.state().exists() && best.as_ref().is_none_or(|(b, _)| n > *b) {
                best = Some((n, ckpt));
            }
        }
        Ok(best)
    }
}

/// A checkpoint directory: the policy (and critic) in HF layout, the optimizers' state and
/// `state.json` (step, data cursor, fingerprint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint(PathBuf);

impl Checkpoint {
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Where the checkpoint is assembled before it is renamed into place.
    pub fn staging(&self) -> Checkpoint {
        Checkpoint(self.0.with_extension("tmp"))
    }

    pub fn state(&self) -> PathBuf {
        self.0.join("state.json")
    }

    pub fn policy(&self) -> PathBuf {
        self.0.join("policy")
    }

    pub fn critic(&self) -> PathBuf {
        self.0.join("critic")
    }

    pub fn actor_optim(&self) -> PathBuf {
        self.0.join("actor_optim.safetensors")
    }

    pub fn critic_optim(&self) -> PathBuf {
        self.0.join("critic_optim.safetensors")
    }
}

/// The lines of a JSONL file, none if it does not exist.
pub fn read_lines(path: &Path) -> std::io::Result<Vec<String>> {
    match crate::files::read_to_string(path) {
        Ok(text) => Ok(text.lines().map(String::from).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Lines joined as a JSONL body (each line ends with a newline).
pub fn join_lines(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// The step recorded in a metrics or eval line.
pub fn line_step(line: &str) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.get(metric::STEP)
        .or_else(|| v.get("step"))
        .and_then(|s| s.as_f64())
        .map(|s| s as usize)
}
