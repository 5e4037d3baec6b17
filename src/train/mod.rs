//! The RL loop (paper Section 5, run in verl there): one code path for every scale.
//!
//! One training step ([`step`]), each phase in its own file:
//! prompts ([`batch`], a seeded data order) → rollout, n per prompt (current policy, detached
//! weights) → reward ([`crate::reward`]: the verifier, 0/1 or ±1) → old log-probs recomputed by
//! the policy, values by the critic (PPO types) → advantages ([`crate::algo::advantage`]) →
//! actor update ([`update`]: `epochs` passes over mini-batches of `mini_batch_size` prompts × n
//! responses, each split into micro-batches with an exact aggregation, policy loss → backward →
//! global grad-norm clip → AdamW) → critic update → metrics ([`metrics`], verl's names) →
//! eval → checkpoint ([`checkpoint`]). At tail steps [`probe`] supplies prompt pass rates
//! for the r·Â histograms.
//!
//! Randomness never lives in mutable state: sample s of prompt p at step t draws from the stream
//! (seed, t, p, s), and the data order of epoch e from (seed, e). A checkpoint (weights, optimizer
//! moments, data cursor, step) therefore resumes bit-identically on CPU.
//!
//! The run directory is a [`RunDir`]; every file is written atomically.

pub mod batch;
pub mod checkpoint;
pub mod created;
pub mod metrics;
pub mod outcomes;
pub mod probe;
pub mod start_eval;
pub mod step;
pub mod update;
pub mod warm_start;

use crate::files::{AtPath, PathIoError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::data::DataSuite;
use crate::data::{self, DataLocation, Problem};
use crate::hub::HubOptions;
use crate::hub::ModelSource;
use crate::manifest::Experiment;
use crate::model::load::{self, LoadedModel};
use crate::model::qwen::Qwen;
use crate::model::tokenizer::Tokenizer;
use crate::model::{init, Params, Precision, QwenConfig};
use crate::optim::AdamW;
use crate::run::{self, lock, Provenance, RunDir};
use batch::DataCursor;
use checkpoint::{CheckpointState, Models};

pub use created::{ensure_model, init_fingerprint, InitRecord};
pub use metrics::{step_line, StepMetrics};
pub use start_eval::StartEvals;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    #[error(transparent)]
    Archive(#[from] crate::archive::ArchiveError),
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{name}: actor.kl_loss_coef / actor.use_kl_in_reward need a reference policy, which the trainer does not keep (the paper uses neither: set 0 / false)")]
    KlUnsupported { name: String },
    #[error("{} is being trained by another acpo process (it holds {}); nothing was changed", dir.display(), lock.display())]
    Busy { dir: PathBuf, lock: PathBuf },
    #[error("{} already holds this run: pass --resume to continue it (nothing was changed)", dir.display())]
    AlreadyTrained { dir: PathBuf },
    #[error("{}: checkpoint of another manifest", path.display())]
    ForeignCheckpoint { path: PathBuf },
    #[error("{} exists but was not created by model.init (no init.json): remove it to create it, or drop model.init to use it as it is", dir.display())]
    NotCreated { dir: PathBuf },
    #[error("{} was created by a different model.init (fingerprint {found}, this manifest's is {want}): remove it to create it anew, or point model.dir elsewhere", dir.display())]
    OtherInit {
        dir: PathBuf,
        found: String,
        want: String,
    },
    #[error("{}: files do not match its SHA256SUMS ({report}): remove it to create it anew", dir.display())]
    ModelChanged { dir: PathBuf, report: String },
    #[error("warm start: the tokenizer names no EOS token")]
    NoEos,
    #[error("model.init.warm_start.max_response_length: no worked solution fits in {max_response_length} tokens")]
    NoSolutionFits { max_response_length: usize },
    #[error("the model has no parameters")]
    NoParameters,
    #[error("step {step}: the update left a parameter NaN or infinite; the run stopped before saving anything (the last checkpoint is intact)")]
    NonFiniteParameters { step: usize },
    #[error("step {step}: {metric} is {value}; the update was not applied and the run stopped (the last checkpoint is intact)")]
    NonFinite {
        step: usize,
        metric: &'static str,
        value: f64,
    },
}

impl From<candle_core::Error> for TrainError {
    fn from(e: candle_core::Error) -> Self {
        TrainError::Model(e.into())
    }
}

pub type Result<T> = std::result::Result<T, TrainError>;

/// How `acpo train` was invoked.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub out_root: PathBuf,
    pub resume: bool,
    /// Stop after this many steps (the manifest's total is unchanged).
    pub max_steps: Option<usize>,
    pub data: DataLocation,
    pub hub: HubOptions,
    /// Step-0 evaluations shared with the other runs of this process ([`StartEvals`]); None:
    /// the run evaluates its own.
    pub start_evals: Option<std::sync::Arc<StartEvals>>,
}

/// What the run reports while it goes (for a progress display).
#[derive(Debug)]
pub enum Event<'a> {
    /// Training starts (or resumes) at `step` of `total`.
    Start {
        step: usize,
        total: usize,
    },
    Step {
        step: usize,
        total: usize,
        metrics: &'a BTreeMap<String, f64>,
    },
    Eval {
        step: usize,
        weighted_accuracy: f64,
    },
    /// The model's warm start (before any run step) finished `step` of `total`.
    WarmStart {
        step: usize,
        total: usize,
        loss: f64,
    },
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("invariant: metrics, summaries and tails are JSON")
}

/// Where a run stands: its checkpointed state (step, data cursor), the step it resumed from,
/// and the lines of `metrics.jsonl` and `eval.jsonl` so far.
struct Ledger {
    state: CheckpointState,
    resumed_from: Option<usize>,
    metrics_lines: Vec<String>,
    eval_lines: Vec<String>,
}

/// Everything one run needs in memory.
pub struct Trainer {
    exp: Experiment,
    cfg: QwenConfig,
    tokenizer: Tokenizer,
    policy: Params,
    critic: Option<Params>,
    actor_opt: AdamW,
    critic_opt: Option<AdamW>,
    problems: Vec<Problem>,
    prompt_ids: BTreeMap<usize, Vec<u32>>,
    eos: Vec<u32>,
    run: RunDir,
    device: Device,
    /// This process's exclusive hold on the run directory.
    _lock: crate::run::lock::Lock,
}

/// Result of a finished (or stopped) `train` call.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    pub dir: PathBuf,
    pub steps_done: usize,
    pub resumed_from: Option<usize>,
}

impl TrainSummary {
    /// One line for the user.
    pub fn describe(&self, total: usize) -> String {
        let (done, dir) = (self.steps_done, self.dir.display());
        match self.resumed_from {
            Some(s) => {
                format!("resumed from step {s}; now at step {done} of {total}; run directory {dir}")
            }
            None => format!("trained {done} of {total} steps; run directory {dir}"),
        }
    }
}

impl Trainer {
    /// Builds the trainer for `exp`, writing (or, with `resume`, reopening) its run directory.
    pub fn new(exp: &Experiment, manifest_text: &str, opts: &TrainOptions) -> Result<Trainer> {
        if exp.actor.kl_loss_coef != 0.0 || exp.actor.use_kl_in_reward {
            return Err(TrainError::KlUnsupported {
                name: exp.name.clone(),
            });
        }
        ensure_model(exp, |_| {})?;
        let LoadedModel {
            cfg,
            tokenizer,
            params: policy,
            device,
            ..
        } = load::load(
            &exp.model.source,
            &opts.hub,
            exp.device,
            Precision::training(exp.model.dtype),
        )?;
        if let Some(limit) = cfg.max_position_embeddings {
            // what `check` tests where the config is local, for a hub model once downloaded
            let config = match &exp.model.source {
                ModelSource::Hub { repo, revision } => {
                    PathBuf::from(format!("{repo}@{revision}/config.json"))
                }
                ModelSource::Dir(dir) => dir.join("config.json"),
            };
            exp.check_context(Path::new(&exp.name), limit, &config)?;
        }
        let critic = match &exp.critic {
            Some(_) => Some(init::add_value_head(&policy, &cfg, exp.seed)?),
            None => None,
        };
        let actor_opt = AdamW::new(&policy, &exp.actor.optim)?;
        let critic_opt = match (&critic, &exp.critic) {
            (Some(p), Some(c)) => Some(AdamW::new(p, &c.optim)?),
            _ => None,
        };
        let problems = match exp.data.suite {
            DataSuite::Real => data::load(&data::dapo::SPEC, &opts.data)?,
            DataSuite::Synthetic => data::synthetic::train(),
        };
        let eos = load::eos_ids(&cfg, &tokenizer);
        let run = RunDir::of(exp, &opts.out_root);
        let lock = lock::acquire(run.path(), lock::Wait::NoWait)
            .at(lock::path_for(run.path()))?
            .ok_or_else(|| TrainError::Busy {
                dir: run.path().to_owned(),
                lock: lock::path_for(run.path()),
            })?;
        let has_ckpt = run.latest_checkpoint().at(run.path())?.is_some();
        if run.metrics().exists() && !opts.resume && has_ckpt {
            return Err(TrainError::AlreadyTrained {
                dir: run.path().to_owned(),
            });
        }
        std::fs::create_dir_all(run.checkpoints()).at(run.path())?;
        crate::atomic::write(&run.manifest(), manifest_text.as_bytes())?;
        crate::atomic::write(&run.fingerprint(), exp.fingerprint().as_bytes())?;
        Ok(Trainer {
            exp: exp.clone(),
            cfg,
            tokenizer,
            policy,
            critic,
            actor_opt,
            critic_opt,
            problems,
            prompt_ids: BTreeMap::new(),
            eos,
            run,
            device,
            _lock: lock,
        })
    }

    /// The token ids of training problem `index` under the manifest's template (cached).
    fn prompt(&mut self, index: usize) -> Result<Vec<u32>> {
        if let Some(p) = self.prompt_ids.get(&index) {
            return Ok(p.clone());
        }
        let mut ids = crate::eval::encode_prompt(
            &self.tokenizer,
            self.exp.data.prompt_template,
            self.exp.data.apply_chat_template,
            &self.problems[index].problem,
        )?;
        // Keep the end of overlong prompts (the question and the chat template's tail).
        let max = self.exp.data.max_prompt_length;
        if ids.len() > max {
            ids.drain(..ids.len() - max);
        }
        self.prompt_ids.insert(index, ids.clone());
        Ok(ids)
    }

    fn models(&self) -> Models<'_> {
        Models {
            cfg: &self.cfg,
            policy: &self.policy,
            critic: self.critic.as_ref(),
        }
    }

    /// Runs (or resumes) training; returns when the manifest's steps or `max_steps` are done.
    pub fn run(
        &mut self,
        opts: &TrainOptions,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<TrainSummary> {
        let mut ledger = self.resume(opts.resume)?;
        let total = self.exp.trainer.total_steps;
        let stop_at = opts
            .max_steps
            .map_or(total, |m| (ledger.state.step + m).min(total));
        let mut prov = self.provenance(ledger.state.step, ledger.resumed_from.is_some());
        crate::atomic::write(&self.run.provenance(), pretty(&prov).as_bytes())?;
        on_event(Event::Start {
            step: ledger.state.step,
            total,
        });
        let fresh = ledger.state.step == 0 && ledger.resumed_from.is_none();
        if fresh && self.exp.trainer.evaluates_at_start() {
            let summary = match &opts.start_evals {
                Some(shared) => shared
                    .get_or_evaluate(StartEvals::key(&self.exp, &opts.data), || {
                        Ok::<_, TrainError>(self.eval_summary(0, opts)?.0)
                    })?,
                None => self.eval_summary(0, opts)?.0,
            };
            self.record_eval(&summary, &mut ledger.eval_lines)?;
            on_event(Event::Eval {
                step: 0,
                weighted_accuracy: summary.weighted_accuracy,
            });
        }
        while ledger.state.step < stop_at {
            ledger.state.step += 1;
            self.step(&mut ledger, opts, stop_at, on_event)?;
        }
        prov.finish(ledger.state.step);
        crate::atomic::write(&self.run.provenance(), pretty(&prov).as_bytes())?;
        // Checksums over everything the run wrote (acpo verify <run dir>).
        crate::archive::write_sums(self.run.path())?;
        Ok(TrainSummary {
            dir: self.run.path().to_owned(),
            steps_done: ledger.state.step,
            resumed_from: ledger.resumed_from,
        })
    }

    /// Where training starts: step 0, or (with `resume`) the latest checkpoint, its models and
    /// optimizers restored; the run's lines after that point dropped.
    fn resume(&mut self, resume: bool) -> Result<Ledger> {
        let fp = self.exp.fingerprint();
        let mut state = CheckpointState {
            step: 0,
            cursor: DataCursor { epoch: 0, index: 0 },
            fingerprint: fp.clone(),
        };
        let mut resumed_from = None;
        let mut metrics_lines = run::read_lines(&self.run.metrics()).at(self.run.metrics())?;
        let mut eval_lines = run::read_lines(&self.run.eval()).at(self.run.eval())?;
        let checkpoint = match resume {
            true => self.run.latest_checkpoint().at(self.run.path())?,
            false => None,
        };
        if let Some((_, ckpt)) = checkpoint {
            let models = Models {
                cfg: &self.cfg,
                policy: &self.policy,
                critic: self.critic.as_ref(),
            };
            state = checkpoint::restore(
                &ckpt,
                &fp,
                models,
                &mut self.actor_opt,
                self.critic_opt.as_mut(),
            )?;
            resumed_from = Some(state.step);
        }
        // What was written after the starting point (the checkpoint, or nothing: a run that
        // died before its first checkpoint starts afresh) is recomputed, bit-identically.
        let step = state.step;
        let kept = |l: &String| step > 0 && run::line_step(l).is_some_and(|s| s <= step);
        metrics_lines.retain(kept);
        eval_lines.retain(kept);
        self.drop_tails_after(step)?;
        Ok(Ledger {
            state,
            resumed_from,
            metrics_lines,
            eval_lines,
        })
    }

    /// Training step `ledger.state.step` and what is written after it: the evaluation when
    /// the schedule has one, then the step's metrics line (with the evaluation's time), its
    /// tails, then the checkpoint: the line is on disk before the checkpoint that a resume
    /// starts from.
    fn step(
        &mut self,
        ledger: &mut Ledger,
        opts: &TrainOptions,
        stop_at: usize,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<()> {
        let step = ledger.state.step;
        let (metrics, tails) = self.train_step(step, &mut ledger.state.cursor)?;
        let mut metrics = metrics.to_verl();
        let mut after = metrics::PhaseClock::start(&self.device);
        let eval = if self.exp.trainer.evaluates_at(step) {
            let (accuracy, tokens) = self.evaluate(step, opts, &mut ledger.eval_lines)?;
            after.lap("testing", Some(tokens));
            Some(accuracy)
        } else {
            None
        };
        metrics.extend(after.phases().metrics());
        ledger.metrics_lines.push(to_json(&metrics));
        self.write_metrics(&ledger.metrics_lines)?;
        if let Some(t) = tails {
            std::fs::create_dir_all(self.run.tails_dir()).at(self.run.tails_dir())?;
            crate::atomic::write(&self.run.tails(step), to_json(&t).as_bytes())?;
        }
        let total = self.exp.trainer.total_steps;
        on_event(Event::Step {
            step,
            total,
            metrics: &metrics,
        });
        if let Some(accuracy) = eval {
            on_event(Event::Eval {
                step,
                weighted_accuracy: accuracy,
            });
        }
        if step.is_multiple_of(self.exp.trainer.checkpoint_every) || step == stop_at {
            checkpoint::save(
                &self.run,
                &ledger.state,
                self.models(),
                &self.actor_opt,
                self.critic_opt.as_ref(),
            )?;
            // the step's line gains the checkpoint's time
            after.lap("save_checkpoint", None);
            metrics.extend(after.phases().metrics());
            *ledger
                .metrics_lines
                .last_mut()
                .expect("invariant: this step's line") = to_json(&metrics);
            self.write_metrics(&ledger.metrics_lines)?;
        }
        Ok(())
    }

    /// `metrics.jsonl`, rewritten atomically.
    fn write_metrics(&self, lines: &[String]) -> Result<()> {
        crate::atomic::write(&self.run.metrics(), run::join_lines(lines).as_bytes())?;
        Ok(())
    }

    /// Removes the tail histograms of steps after `step` (left by a run that went further).
    fn drop_tails_after(&self, step: usize) -> Result<()> {
        let dir = self.run.tails_dir();
        if !dir.exists() {
            return Ok(());
        }
        for entry in std::fs::read_dir(&dir).at(&dir)? {
            let path = entry.at(&dir)?.path();
            let later = path
                .file_stem()
                .and_then(|s| s.to_str()?.strip_prefix("step_")?.parse::<usize>().ok())
                .is_some_and(|s| s > step);
            if later {
                std::fs::remove_file(&path).at(&path)?;
            }
        }
        Ok(())
    }

    /// The run's provenance from `step`; a resumed run keeps the time it first started.
    fn provenance(&self, step: usize, resumed: bool) -> Provenance {
        let mut prov = Provenance::start(&self.exp, &device_name(&self.device));
        prov.steps_done = step;
        if resumed {
            let old = crate::files::read(self.run.provenance()).ok();
            if let Some(old) = old.and_then(|b| serde_json::from_slice::<Provenance>(&b).ok()) {
                prov.started_unix = old.started_unix;
                prov.started_utc = old.started_utc;
            }
        }
        prov
    }

    /// Evaluates the current policy and appends the summary to `eval.jsonl` (rewritten
    /// atomically); returns its weighted accuracy and the tokens it generated.
    fn evaluate(
        &self,
        step: usize,
        opts: &TrainOptions,
        eval_lines: &mut Vec<String>,
    ) -> Result<(f64, usize)> {
        let (summary, tokens) = self.eval_summary(step, opts)?;
        self.record_eval(&summary, eval_lines)?;
        Ok((summary.weighted_accuracy, tokens))
    }

    /// The current policy's evaluation and the tokens it generated.
    fn eval_summary(
        &self,
        step: usize,
        opts: &TrainOptions,
    ) -> Result<(crate::eval::EvalSummary, usize)> {
        let model = Qwen::new(&self.cfg, &self.policy, true)?;
        let (summary, records) = crate::eval::evaluate(
            &model,
            &self.tokenizer,
            &self.exp,
            &opts.data,
            step,
            |_, _, _| {},
        )?;
        Ok((summary, records.iter().map(|r| r.num_tokens).sum()))
    }

    /// Appends `summary` to `eval.jsonl` (rewritten atomically).
    fn record_eval(
        &self,
        summary: &crate::eval::EvalSummary,
        eval_lines: &mut Vec<String>,
    ) -> Result<()> {
        eval_lines.push(to_json(summary));
        crate::atomic::write(&self.run.eval(), run::join_lines(eval_lines).as_bytes())?;
        Ok(())
    }
}

fn pretty<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("invariant: provenance is JSON")
}

/// How provenance names a device.
fn device_name(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda".into(),
        Device::Metal(_) => "metal".into(),
    }
}
