//! verl, the distributed engine the paper trained with (issue #21): a manifest as a verl launch.
//!
//! Runs beyond one GPU (the 7B/8B policies and critics of Table 1) train on verl; everything
//! around the training stays ours. [`launch`] turns a manifest into the Hydra overrides of verl's
//! `main_ppo` (read from verl 0.9.1's `_generated_ppo_trainer.yaml`), and accounts for every field
//! the manifest writes: set by an override, equal to what verl does anyway, carried by the
//! prepared data, metadata, or unsupported with the reason. Nothing is dropped silently
//! (`tests/it/verl.rs` enumerates the fields of every shipped manifest).
//!
//! [`import`] goes the other way: verl's logs of a run become our run directory.
//!
//! Every launch needs the Python package `acpo` (python/, `pip install ./python`) where verl
//! runs: its reward function `acpo.verl.compute_score_async` judges answers with our verifier in
//! verl's own reward loop, and, for the -AC variants, its policy loss `acpo` (paper eq. 5,
//! −clip(r·Â, −α, α)) with a `PolicyLossConfig` that carries α, which the package registers in
//! verl through a `verl.plugins` entry point in every worker (no import, no PYTHONPATH).

pub mod data;
pub mod import;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::algo::clip::{PolicyClip, VerlValue};
use crate::algo::method::LossAggMode;
use crate::data::DataSuite;
use crate::files::{AtPath, PathIoError};
use crate::manifest::raw;
use crate::model::spec::{DType, Device};
use crate::report::table::{Align::Left, Table};
use crate::reward::RewardKind;

/// verl's configuration the overrides are written against.
pub const VERL_VERSION: &str = "0.9.1";

/// The GPUs a launch spans (the script finds its data and output directory in the
/// environment: `ACPO_VERL_DATA`, `ACPO_VERL_OUT`).
#[derive(Debug, Clone)]
pub struct Target {
    pub gpus_per_node: usize,
    pub nodes: usize,
}

/// One Hydra override and the manifest fields it comes from (none: a constant of the launch).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: String,
    pub value: String,
    pub from: Vec<&'static str>,
}

/// How a manifest field that sets no override is honoured, or why it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Account {
    /// The value is what verl does without being told.
    VerlDefault,
    /// Rendered into the prepared parquet files (prompts, chat template).
    Data,
    /// Describes the run; nothing to run differently.
    Metadata,
    /// verl cannot do this; the launch differs from the manifest here.
    Unsupported,
}

/// A manifest field without an override of its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub field: &'static str,
    pub account: Account,
    pub why: String,
}

/// A manifest as a verl launch.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub name: String,
    pub overrides: Vec<Override>,
    pub notes: Vec<Note>,
}

impl Launch {
    fn set(&mut self, key: &str, value: impl ToString, from: &[&'static str]) {
        self.overrides.push(Override {
            key: key.to_owned(),
            value: value.to_string(),
            from: from.to_vec(),
        });
    }

    fn note(&mut self, field: &'static str, account: Account, why: impl Into<String>) {
        self.notes.push(Note {
            field,
            account,
            why: why.into(),
        });
    }

    /// The fields the launch accounts for: the sources of its overrides and its notes.
    pub fn fields(&self) -> impl Iterator<Item = &'static str> + '_ {
        let from = self.overrides.iter().flat_map(|o| o.from.iter().copied());
        from.chain(self.notes.iter().map(|n| n.field))
    }

    pub fn unsupported(&self) -> impl Iterator<Item = &Note> {
        self.notes
            .iter()
            .filter(|n| n.account == Account::Unsupported)
    }

    /// The launch script: `python3 -m verl.trainer.main_ppo` with one override per line.
    pub fn script(&self, manifest: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "#!/usr/bin/env bash");
        let _ = writeln!(
            s,
            "# verl launch of `{}`, written by `acpo export verl {manifest}` for verl {VERL_VERSION}.",
            self.name
        );
        s.push_str(
            "# ACPO_VERL_DATA: the parquet files of the training set and the benchmarks (default:\n\
             #   data/ beside this script, written by `acpo export verl --data`);\n\
             # ACPO_VERL_OUT: where the run's metrics, validation dumps and checkpoints go.\n\
             # Needs the Python package acpo where verl runs (`pip install ./python` in the acpo\n\
             #   repository): the reward function, and the policy loss `acpo` it registers in verl.\n",
        );
        let unsupported: Vec<_> = self.unsupported().collect();
        if !unsupported.is_empty() {
            let _ = writeln!(
                s,
                "# Differs from the manifest (unsupported by verl): {}.",
                unsupported
                    .iter()
                    .map(|n| n.field)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        s.push_str(
            "set -euo pipefail\n\
             HERE=\"$(cd \"$(dirname \"$0\")\" && pwd)\"\n\
             DATA=\"${ACPO_VERL_DATA:-$HERE/data}\"\n\
             python3 -c 'import acpo.verl' 2>/dev/null || { echo \"error: python3 cannot import acpo.verl: pip install ./python in the acpo repository\" >&2; exit 2; }\n\
             ls \"$DATA\"/*.parquet >/dev/null 2>&1 || { echo \"error: no parquet files in $DATA (acpo export verl --data)\" >&2; exit 2; }\n\
             OUT=\"${ACPO_VERL_OUT:-$PWD/verl-runs}\"\n",
        );
        // verl's file logger opens its file with "w": a relaunch (resume_mode=auto) would
        // truncate the earlier attempt's steps, so each attempt logs to a file of its own.
        let _ = writeln!(
            s,
            "export VERL_FILE_LOGGER_PATH=\"$OUT/{}/metrics.$(date -u +%Y%m%dT%H%M%SZ).jsonl\"",
            self.name
        );
        s.push_str("python3 -m verl.trainer.main_ppo");
        for o in &self.overrides {
            let _ = write!(s, " \\\n    \"{}={}\"", o.key, o.value);
        }
        s.push('\n');
        s
    }

    /// Every field's account as a Markdown table (what `acpo export verl` writes beside the
    /// script).
    pub fn accounts(&self) -> String {
        let mut t = Table::new([("manifest field", Left), ("verl", Left)]);
        let mut rows: Vec<(&str, String)> = Vec::new();
        for o in &self.overrides {
            for f in &o.from {
                rows.push((f, format!("`{}={}`", o.key, o.value)));
            }
        }
        for n in &self.notes {
            let what = match n.account {
                Account::VerlDefault => "verl's default",
                Account::Data => "the parquet files",
                Account::Metadata => "metadata",
                Account::Unsupported => "**unsupported**",
            };
            rows.push((n.field, format!("{what}: {}", n.why)));
        }
        rows.sort_by(|a, b| a.0.cmp(b.0));
        for (field, what) in rows {
            t.row([field.to_string(), what]);
        }
        t.to_string()
    }
}

/// A float as Hydra reads it back: `3.0` not `3` (an int in Hydra's grammar), full precision.
fn float(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.1}")
    } else {
        format!("{x:?}")
    }
}

const ACTOR: &str = "actor_rollout_ref.actor";
const ROLLOUT: &str = "actor_rollout_ref.rollout";
const MODEL: &str = "actor_rollout_ref.model";

/// `m` as a verl launch on `target`.
/// Why a run could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Flag(String),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("cannot write {}: {}", .0.path.display(), .0.source)]
    Write(PathIoError),
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    pub script: PathBuf,
    pub fields: PathBuf,
    pub data: Vec<data::Written>,
    pub unsupported: Vec<Note>,
}

/// The files an export puts in its directory: what it may replace.
const EXPORT_FILES: [&str; 4] = ["launch.sh", "fields.md", "data", MARKER];

/// The file that marks a directory as an export's: the only proof that replacing it deletes
/// nothing a user made (a user's `launch.sh` and `data/` look like an export's).
const MARKER: &str = ".acpo-export-verl";

/// The marker's first line.
const MARKER_TEXT: &str =
    "written by `acpo export verl`: this directory is replaced by the next export into it\n";

/// Whether `out` may be written: absent, or a directory an earlier export made (its marker a
/// regular file with the marker's text, nothing in it but what an export writes). A link is
/// refused whatever it points to: the export would replace it with a directory.
fn destination(out: &Path) -> Result<(), ExportError> {
    let refuse = |reason: &str| {
        Err(ExportError::Invalid {
            path: out.to_owned(),
            reason: format!("{reason}: export into a new directory (nothing was written)"),
        })
    };
    if out.file_name().is_none() {
        return refuse("--out must name a directory");
    }
    let meta = match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        other => other.at(out).map_err(ExportError::Write)?,
    };
    if meta.file_type().is_symlink() {
        return refuse("is a symbolic link, which the export would replace");
    }
    let marker = out.join(MARKER);
    let marked = meta.is_dir()
        && std::fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file() && m.len() < 4096)
        && crate::files::read_to_string(&marker).is_ok_and(|t| t.starts_with(MARKER_TEXT));
    let only_ours = std::fs::read_dir(out).is_ok_and(|entries| {
        entries
            .flatten()
            .all(|e| EXPORT_FILES.contains(&e.file_name().to_string_lossy().as_ref()))
    });
    if !(marked && only_ours) {
        return refuse(&format!(
            "exists and is not an earlier `acpo export verl` (no {MARKER} marker, or files it did not write)"
        ));
    }
    Ok(())
}

/// `acpo export verl`: the launch of `manifest` on `target` (`launch.sh`) and its
/// field-by-field account (`fields.md`), with `data` the parquet files (`data/`), in `out`.
/// Everything is built in a staging directory beside `out` and renamed into place when
/// complete; `out` must be new or an earlier export (issue #35: a dataset that fails leaves
/// nothing half written).
pub fn export(
    manifest: &Path,
    out: &Path,
    target: &Target,
    with_data: Option<&crate::data::DataLocation>,
) -> Result<Exported, ExportError> {
    if target.gpus_per_node == 0 || target.nodes == 0 {
        return Err(ExportError::Flag(
            "--gpus and --nodes must be at least 1".into(),
        ));
    }
    let (exp, raw) = crate::manifest::Experiment::load_with_raw(manifest)?;
    destination(out)?;
    let launch = launch(&raw, target);
    let written = |path: &Path, r: std::io::Result<()>| r.at(path).map_err(ExportError::Write);
    let staged = crate::atomic::StagedDir::new(out, "export")
        .at(crate::atomic::staging(out, "export"))
        .map_err(ExportError::Write)?;
    let stage = staged.path().to_owned();
    crate::atomic::write(
        &stage.join(MARKER),
        format!("{MARKER_TEXT}manifest: {}\n", manifest.display()).as_bytes(),
    )
    .map_err(ExportError::Write)?;
    let script = stage.join("launch.sh");
    crate::atomic::write(
        &script,
        launch.script(&manifest.display().to_string()).as_bytes(),
    )
    .map_err(ExportError::Write)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        written(
            &script,
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)),
        )?;
    }
    let fields = stage.join("fields.md");
    crate::atomic::write(&fields, launch.accounts().as_bytes()).map_err(ExportError::Write)?;
    let data = match with_data {
        Some(from) => data::write_parquet(&exp, from, &stage.join("data"))?,
        None => Vec::new(),
    };
    written(out, staged.commit(out))?;
    Ok(Exported {
        script: out.join("launch.sh"),
        fields: out.join("fields.md"),
        data: data
            .into_iter()
            .map(|w| data::Written {
                path: out
                    .join("data")
                    .join(w.path.file_name().unwrap_or_default()),
                rows: w.rows,
            })
            .collect(),
        unsupported: launch.unsupported().cloned().collect(),
    })
}

pub fn launch(m: &raw::Manifest, target: &Target) -> Launch {
    let mut l = Launch {
        name: m.name.clone(),
        ..Launch::default()
    };
    let ppo = m.algorithm.name.is_ppo_type();
    run_fields(&mut l, m, target);
    model_fields(&mut l, &m.model, ppo);
    algorithm_fields(&mut l, &m.algorithm);
    data_fields(&mut l, &m.data, &m.eval);
    rollout_fields(&mut l, &m.rollout);
    actor_fields(&mut l, &m.actor, ppo);
    if let Some(c) = &m.critic {
        critic_fields(&mut l, c);
    }
    trainer_fields(&mut l, &m.trainer);
    eval_fields(&mut l, &m.eval, m.data.max_response_length);
    l
}

fn run_fields(l: &mut Launch, m: &raw::Manifest, target: &Target) {
    l.set("trainer.project_name", "acpo", &[]);
    l.set("trainer.experiment_name", &m.name, &["name"]);
    l.set("data.seed", m.seed, &["seed"]);
    l.set(&format!("{ROLLOUT}.seed"), m.seed, &["seed"]);
    l.set(&format!("{ACTOR}.data_loader_seed"), m.seed, &["seed"]);
    match m.device {
        Device::Cuda => l.set("trainer.device", "cuda", &["device"]),
        Device::Cpu | Device::Auto => l.note(
            "device",
            Account::Unsupported,
            "verl trains on GPUs: the launch uses cuda",
        ),
    }
    l.set("trainer.n_gpus_per_node", target.gpus_per_node, &[]);
    l.set("trainer.nnodes", target.nodes, &[]);
    l.set(&format!("{ROLLOUT}.name"), "vllm", &[]);
    l.note(
        "scale",
        Account::Metadata,
        "which manifests a reproduction runs together",
    );
    if m.description.is_some() {
        l.note("description", Account::Metadata, "for people");
    }
    if m.kv_layout.is_some() {
        l.note(
            "kv_layout",
            Account::VerlDefault,
            "vLLM, verl's rollout engine, always pages its KV cache",
        );
    }
    // Logs our import reads (`acpo import verl`): one JSON line per step, validation dumps.
    l.set("trainer.logger", "[console,file]", &[]);
    l.set(
        "trainer.validation_data_dir",
        format!("$OUT/{}/validation", m.name),
        &[],
    );
    l.set(
        "trainer.default_local_dir",
        format!("$OUT/{}/checkpoints", m.name),
        &[],
    );
}

fn model_fields(l: &mut Launch, model: &raw::Model, ppo: bool) {
    let path = match (&model.repo, &model.dir) {
        (Some(repo), _) => Some((repo.clone(), "model.repo")),
        // a directory acpo makes (`model.init`) is a random model verl cannot start from
        (None, Some(dir)) if model.init.is_none() => Some((dir.display().to_string(), "model.dir")),
        _ => None,
    };
    match path {
        Some((path, field)) => {
            l.set(&format!("{MODEL}.path"), &path, &[field]);
            if ppo {
                l.set("critic.model.path", &path, &[field]);
            }
        }
        None => {
            l.note(
                "model.dir",
                Account::Unsupported,
                "a random model made by acpo: write it with `acpo model init`, then give its directory",
            );
            l.note(
                "model.init",
                Account::Unsupported,
                "verl starts from a checkpoint; acpo's random models and warm start are acpo's",
            );
        }
    }
    if let Some(rev) = &model.revision {
        if rev == "main" {
            l.note(
                "model.revision",
                Account::VerlDefault,
                "verl loads a hub id at its default branch",
            );
        } else {
            l.note(
                "model.revision",
                Account::Unsupported,
                format!("verl loads a hub id at its default branch: download `{rev}` and give the local directory"),
            );
        }
    }
    match model.dtype {
        DType::Bf16 => l.note(
            "model.dtype",
            Account::VerlDefault,
            "FSDP mixed precision: fp32 masters and optimizer state, bf16 compute (as acpo's bf16)",
        ),
        DType::F32 | DType::F16 => l.note(
            "model.dtype",
            Account::Unsupported,
            "the launch keeps verl's bf16 mixed precision",
        ),
    }
    l.set(
        &format!("{MODEL}.enable_gradient_checkpointing"),
        model.gradient_checkpointing,
        &["model.gradient_checkpointing"],
    );
    if ppo {
        l.set(
            "critic.model.enable_gradient_checkpointing",
            model.gradient_checkpointing,
            &["model.gradient_checkpointing"],
        );
    }
    if model.layer_backward.is_some() {
        l.note(
            "model.layer_backward",
            Account::VerlDefault,
            "verl's FSDP workers take PyTorch's autograd backward; by hand or not, the same gradients to round-off",
        );
    }
    if model.attention_backward.is_some() {
        l.note(
            "model.attention_backward",
            Account::VerlDefault,
            "verl's attention backward is FlashAttention-2's or sdpa's own; acpo's two give the same gradients to round-off",
        );
    }
    if let Some(n) = model.max_position_embeddings {
        l.set(
            &format!("+{MODEL}.override_config.max_position_embeddings"),
            n,
            &["model.max_position_embeddings"],
        );
    }
}

fn algorithm_fields(l: &mut Launch, a: &raw::Algorithm) {
    let estimator = if a.name.is_ppo_type() { "gae" } else { "grpo" };
    l.set("algorithm.adv_estimator", estimator, &["algorithm.name"]);
    clip_rule_fields(l, a);
    if let Some(g) = a.gamma {
        l.set("algorithm.gamma", float(g), &["algorithm.gamma"]);
    }
    if let Some(lam) = a.lam {
        l.set("algorithm.lam", float(lam), &["algorithm.lam"]);
    }
    match a.whiten_advantages {
        Some(true) => l.note(
            "algorithm.whiten_advantages",
            Account::VerlDefault,
            "verl's GAE whitens the advantages over the batch",
        ),
        Some(false) => l.note(
            "algorithm.whiten_advantages",
            Account::Unsupported,
            "verl's GAE always whitens the advantages",
        ),
        None => {}
    }
    if let Some(b) = a.norm_adv_by_std_in_grpo {
        l.set(
            "algorithm.norm_adv_by_std_in_grpo",
            b,
            &["algorithm.norm_adv_by_std_in_grpo"],
        );
    }
    let mode = match a.loss_agg_mode {
        LossAggMode::TokenMean => Some("token-mean"),
        LossAggMode::SeqMeanTokenSum => Some("seq-mean-token-sum"),
        LossAggMode::SeqMeanTokenMean => Some("seq-mean-token-mean"),
        LossAggMode::SeqMeanTokenSumNorm => Some("seq-mean-token-sum-norm"),
        LossAggMode::TokenMeanMicrobatch => None,
    };
    match mode {
        Some(mode) => l.set(
            &format!("{ACTOR}.loss_agg_mode"),
            mode,
            &["algorithm.loss_agg_mode"],
        ),
        None => l.note(
            "algorithm.loss_agg_mode",
            Account::Unsupported,
            "verl's token-mean averages over the mini-batch's tokens, not per micro-batch",
        ),
    }
}

/// The clipping rule's loss mode and keys, as the rule says verl runs it (`algo::clip`): a
/// baseline's loss is verl's own, the -AC variants' the plug-in's; a rule verl does not have is
/// listed, saying why.
fn clip_rule_fields(l: &mut Launch, a: &raw::Algorithm) {
    let rule = match PolicyClip::from_fields(a.name, &a.clip_fields()) {
        Ok(rule) => rule,
        // a launch is made of a validated manifest, so this names what validation refused
        Err(e) => return l.note("algorithm.name", Account::Unsupported, e.to_string()),
    };
    let chosen_by: &[&'static str] = match a.policy_loss {
        Some(_) => &["algorithm.name", "algorithm.policy_loss"],
        None => &["algorithm.name"],
    };
    match rule.verl_loss_mode() {
        Ok(loss) => l.set(&format!("{ACTOR}.policy_loss.loss_mode"), loss, chosen_by),
        Err(why) => l.note("algorithm.policy_loss", Account::Unsupported, why),
    }
    for k in rule.verl_keys() {
        let plus = if k.added { "+" } else { "" };
        let value = match k.value {
            VerlValue::Text(text) => text.to_owned(),
            VerlValue::Number(x) => float(x),
        };
        l.set(&format!("{plus}{ACTOR}.{}", k.key), value, &[k.from]);
    }
}

fn data_fields(l: &mut Launch, d: &raw::Data, e: &raw::Eval) {
    match d.suite {
        DataSuite::Real => l.set(
            "data.train_files",
            "$DATA/dapo-math-17k.parquet",
            &["data.suite"],
        ),
        DataSuite::Synthetic => l.note(
            "data.suite",
            Account::Unsupported,
            "the synthetic task has no verl parquet files",
        ),
    }
    let val: Vec<String> = e
        .benchmarks
        .iter()
        .map(|b| format!("$DATA/{}.parquet", b.name()))
        .collect();
    l.set(
        "data.val_files",
        format!("[{}]", val.join(",")),
        &["eval.benchmarks"],
    );
    l.note(
        "data.prompt_template",
        Account::Data,
        "the training prompts are rendered with it",
    );
    l.note(
        "eval.prompt_template",
        Account::Data,
        "the benchmark prompts are rendered with it",
    );
    // The parquet prompts are chat messages: verl applies the model's chat template to them.
    for (field, chat) in [
        ("data.apply_chat_template", d.apply_chat_template),
        ("eval.apply_chat_template", e.apply_chat_template),
    ] {
        if chat {
            l.note(
                field,
                Account::VerlDefault,
                "verl applies the model's chat template to the parquet's messages",
            );
        } else {
            l.note(
                field,
                Account::Unsupported,
                "verl applies the model's chat template to every prompt",
            );
        }
    }
    l.set(
        "data.max_prompt_length",
        d.max_prompt_length,
        &["data.max_prompt_length"],
    );
    l.set(
        "data.max_response_length",
        d.max_response_length,
        &["data.max_response_length"],
    );
    l.set("data.shuffle", d.shuffle, &["data.shuffle"]);
}

fn rollout_fields(l: &mut Launch, r: &raw::Rollout) {
    l.set(&format!("{ROLLOUT}.n"), r.n, &["rollout.n"]);
    l.set(
        &format!("{ROLLOUT}.temperature"),
        float(r.temperature),
        &["rollout.temperature"],
    );
    l.set(
        &format!("{ROLLOUT}.top_p"),
        float(r.top_p),
        &["rollout.top_p"],
    );
    let top_k = r.top_k.map_or(-1, |k| k as i64);
    l.set(&format!("{ROLLOUT}.top_k"), top_k, &["rollout.top_k"]);
}

/// AdamW and its schedule at `prefix` (`actor_rollout_ref.actor` or `critic`).
fn optim_fields(l: &mut Launch, o: &raw::Optim, prefix: &str, fields: [&'static str; 7]) {
    let [lr, schedule, warmup, clip, decay, betas, eps] = fields;
    l.set(&format!("{prefix}.optim.lr"), float(o.lr), &[lr]);
    // LrSchedule has one variant today: constant after warmup.
    l.set(
        &format!("{prefix}.optim.lr_scheduler_type"),
        "constant",
        &[schedule],
    );
    l.set(
        &format!("{prefix}.optim.lr_warmup_steps"),
        o.warmup_steps,
        &[warmup],
    );
    l.set(&format!("{prefix}.grad_clip"), float(o.grad_clip), &[clip]);
    l.set(
        &format!("{prefix}.optim.clip_grad"),
        float(o.grad_clip),
        &[clip],
    );
    l.set(
        &format!("{prefix}.optim.weight_decay"),
        float(o.weight_decay),
        &[decay],
    );
    l.set(
        &format!("{prefix}.optim.betas"),
        format!("[{},{}]", float(o.betas[0]), float(o.betas[1])),
        &[betas],
    );
    if o.eps == 1e-8 {
        l.note(
            eps,
            Account::VerlDefault,
            "torch's AdamW eps, which verl's FSDP optimizer uses",
        );
    } else {
        l.note(
            eps,
            Account::Unsupported,
            "verl's FSDP optimizer keeps torch's AdamW eps of 1e-8",
        );
    }
}

fn actor_fields(l: &mut Launch, a: &raw::Actor, ppo: bool) {
    optim_fields(
        l,
        &a.optim,
        ACTOR,
        [
            "actor.optim.lr",
            "actor.optim.lr_schedule",
            "actor.optim.warmup_steps",
            "actor.optim.grad_clip",
            "actor.optim.weight_decay",
            "actor.optim.betas",
            "actor.optim.eps",
        ],
    );
    // Both count prompts; verl multiplies by rollout.n as acpo does.
    l.set(
        &format!("{ACTOR}.ppo_mini_batch_size"),
        a.mini_batch_size,
        &["actor.mini_batch_size"],
    );
    if let Some(micro) = a.micro_batch_size {
        // Responses per forward/backward pass, on each GPU.
        l.set(
            &format!("{ACTOR}.ppo_micro_batch_size_per_gpu"),
            micro,
            &["actor.micro_batch_size"],
        );
        l.set(
            &format!("{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
            micro,
            &["actor.micro_batch_size"],
        );
        if ppo {
            l.set(
                "critic.ppo_micro_batch_size_per_gpu",
                micro,
                &["actor.micro_batch_size"],
            );
        }
    }
    l.set(&format!("{ACTOR}.ppo_epochs"), a.epochs, &["actor.epochs"]);
    l.set(
        &format!("{ACTOR}.entropy_coeff"),
        float(a.entropy_coeff),
        &["actor.entropy_coeff"],
    );
    l.set(
        &format!("{ACTOR}.use_kl_loss"),
        a.kl_loss_coef > 0.0,
        &["actor.kl_loss_coef"],
    );
    l.set(
        &format!("{ACTOR}.kl_loss_coef"),
        float(a.kl_loss_coef),
        &["actor.kl_loss_coef"],
    );
    l.set(
        "algorithm.use_kl_in_reward",
        a.use_kl_in_reward,
        &["actor.use_kl_in_reward"],
    );
}

fn critic_fields(l: &mut Launch, c: &raw::Critic) {
    optim_fields(
        l,
        &c.optim,
        "critic",
        [
            "critic.optim.lr",
            "critic.optim.lr_schedule",
            "critic.optim.warmup_steps",
            "critic.optim.grad_clip",
            "critic.optim.weight_decay",
            "critic.optim.betas",
            "critic.optim.eps",
        ],
    );
    l.set(
        "critic.cliprange_value",
        float(c.cliprange_value),
        &["critic.cliprange_value"],
    );
}

fn trainer_fields(l: &mut Launch, t: &raw::Trainer) {
    l.set(
        "data.train_batch_size",
        t.batch_size,
        &["trainer.batch_size"],
    );
    l.set(
        "trainer.total_training_steps",
        t.total_steps,
        &["trainer.total_steps"],
    );
    l.set("trainer.test_freq", t.eval_every, &["trainer.eval_every"]);
    // verl evaluates before training unless told not to, as acpo does
    let from: &[&str] = match t.val_before_train {
        Some(_) => &["trainer.eval_every", "trainer.val_before_train"],
        None => &["trainer.eval_every"],
    };
    l.set(
        "trainer.val_before_train",
        t.val_before_train.unwrap_or(true),
        from,
    );
    l.set(
        "trainer.save_freq",
        t.checkpoint_every,
        &["trainer.checkpoint_every"],
    );
    // Training rewards judged by our verifier, on our scale: the package's reward function in
    // verl's own reward loop (its `naive` manager calls it per response as rollouts finish; the
    // judgement runs on a thread pool, the GIL released, in bounded work).
    l.set(
        "reward.custom_reward_function.path",
        "pkg://acpo.verl",
        &["trainer.reward"],
    );
    l.set(
        "reward.custom_reward_function.name",
        "compute_score_async",
        &["trainer.reward"],
    );
    l.set(
        "reward.reward_manager.source",
        "register",
        &["trainer.reward"],
    );
    l.set("reward.reward_manager.name", "naive", &["trainer.reward"]);
    let kind = match t.reward {
        RewardKind::Binary => "binary",
        RewardKind::Signed => "signed",
    };
    l.set(
        "+reward.custom_reward_function.reward_kwargs.kind",
        kind,
        &["trainer.reward"],
    );
    l.note(
        "trainer.tails_every",
        Account::Unsupported,
        "verl logs no r·Â histograms by difficulty (acpo's trainer only)",
    );
    l.note(
        "trainer.difficulty_probe_k",
        Account::Unsupported,
        "the difficulty probe of the r·Â histograms is acpo's trainer only",
    );
}

/// The evaluation settings: verl validates every `test_freq` steps with `val_kwargs`.
fn eval_fields(l: &mut Launch, e: &raw::Eval, max_response_length: usize) {
    let k = format!("{ROLLOUT}.val_kwargs");
    l.set(&format!("{k}.n"), e.k, &["eval.k"]);
    l.set(
        &format!("{k}.do_sample"),
        e.temperature > 0.0,
        &["eval.temperature"],
    );
    l.set(
        &format!("{k}.temperature"),
        float(e.temperature),
        &["eval.temperature"],
    );
    l.set(&format!("{k}.top_p"), float(e.top_p), &["eval.top_p"]);
    if e.max_new_tokens == max_response_length {
        l.note(
            "eval.max_new_tokens",
            Account::VerlDefault,
            "verl validates with the rollout's response length, which equals it",
        );
    } else {
        l.note(
            "eval.max_new_tokens",
            Account::Unsupported,
            format!("verl validates with the rollout's response length ({max_response_length})"),
        );
    }
    if e.limit.is_some() {
        l.note(
            "eval.limit",
            Account::Unsupported,
            "verl validates on every problem of the parquet files",
        );
    }
}
