//! Checkpoints: the policy (and critic) weights, both optimizers' moments, the data cursor and
//! the step, so a run resumes bit-identically. A checkpoint is assembled under a `.tmp` name
//! and renamed when complete: it is complete or absent.

use crate::files::AtPath;
use serde::{Deserialize, Serialize};

use super::batch::DataCursor;
use super::{Result, TrainError};
use crate::model::{init, Params, QwenConfig};
use crate::optim::AdamW;
use crate::run::{Checkpoint, RunDir};

/// `state.json` of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct CheckpointState {
    pub step: usize,
    pub cursor: DataCursor,
    pub fingerprint: String,
}

/// What a checkpoint holds besides its state: the models and their optimizers.
pub(super) struct Models<'a> {
    pub cfg: &'a QwenConfig,
    pub policy: &'a Params,
    pub critic: Option<&'a Params>,
}

/// Writes the checkpoint of `state.step`.
pub(super) fn save(
    run: &RunDir,
    state: &CheckpointState,
    models: Models<'_>,
    actor_opt: &AdamW,
    critic_opt: Option<&AdamW>,
) -> Result<()> {
    let done = run.checkpoint(state.step);
    let tmp = done.staging();
    if tmp.path().exists() {
        std::fs::remove_dir_all(tmp.path()).at(tmp.path())?;
    }
    std::fs::create_dir_all(tmp.policy()).at(tmp.path())?;
    init::save_model(models.cfg, models.policy, &tmp.policy())?;
    actor_opt.save(&tmp.actor_optim())?;
    if let (Some(c), Some(o)) = (models.critic, critic_opt) {
        std::fs::create_dir_all(tmp.critic()).at(tmp.path())?;
        init::save_model(models.cfg, c, &tmp.critic())?;
        o.save(&tmp.critic_optim())?;
    }
    let json = serde_json::to_string_pretty(state).map_err(|source| TrainError::Json {
        path: tmp.state(),
        source,
    })?;
    crate::atomic::write(&tmp.state(), json.as_bytes())?;
    if done.path().exists() {
        std::fs::remove_dir_all(done.path()).at(done.path())?;
    }
    Ok(crate::atomic::commit(tmp.path(), done.path()).at(done.path())?)
}

/// Loads a checkpoint of the manifest with fingerprint `fp` into the models and optimizers.
pub(super) fn restore(
    ckpt: &Checkpoint,
    fp: &str,
    models: Models<'_>,
    actor_opt: &mut AdamW,
    critic_opt: Option<&mut AdamW>,
) -> Result<CheckpointState> {
    let path = ckpt.state();
    let state: CheckpointState = serde_json::from_slice(&crate::files::read(&path).at(&path)?)
        .map_err(|source| TrainError::Json {
            path: path.clone(),
            source,
        })?;
    if state.fingerprint != fp {
        return Err(TrainError::ForeignCheckpoint {
            path: ckpt.path().to_owned(),
        });
    }
    load_into(models.policy, &ckpt.policy())?;
    actor_opt.load(&ckpt.actor_optim())?;
    if let (Some(c), Some(o)) = (models.critic, critic_opt) {
        load_into(c, &ckpt.critic())?;
        o.load(&ckpt.critic_optim())?;
    }
    Ok(state)
}

/// Overwrites the values of `params` with those saved in `dir` (same names and shapes).
fn load_into(params: &Params, dir: &std::path::Path) -> Result<()> {
    let (_, first) = params.vars().next().ok_or(TrainError::NoParameters)?;
    // masters are saved in their own dtype (fp32 for mixed precision): resume is exact
    let loaded = Params::load_dir(dir, first.dtype(), first.device())?;
    for (name, var) in params.vars() {
        let t = loaded.get(name, var.dims())?;
        var.set(&t)?;
    }
    Ok(())
}
