//! The RL loop (paper Section 5, run in verl there): one code path for every scale.
//!
//! One training step:
//! prompts (seeded data order) → rollout n per prompt (current policy, detached weights) →
//! reward (the verifier: 0/1 or ±1) → old log-probs recomputed by the policy, values by the
//! critic (PPO types) → advantages ([`crate::algo::advantage`]) → `epochs` passes over
//! mini-batches of `mini_batch_size` prompts × n responses, each split into micro-batches with
//! an exact aggregation ([`crate::algo::loss::Aggregation`]) → policy loss → backward → global
//! grad-norm clip → AdamW; the same for the critic → metrics (verl names) → [eval] → [checkpoint].
//!
//! Randomness never lives in mutable state: sample s of prompt p at step t draws from the stream
//! (seed, t, p, s), and the data order of epoch e from (seed, e). A checkpoint (weights, optimizer
//! moments, data cursor, step) therefore resumes bit-identically on CPU.
//!
//! Run directory: `<out>/<scale>/<name>-<fingerprint12>/` with `manifest.yaml`, `metrics.jsonl`,
//! `eval.jsonl`, `checkpoints/step_NNNNNN/`; every file is written atomically and a checkpoint
//! directory appears only when complete (written as `.tmp`, then renamed).

pub mod tails;
pub mod warm_start;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tails::{Difficulty, Tails};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::algo::{advantage, loss};
use crate::bench::{self, DataLocation, Problem};
use crate::manifest::{AdvantageEstimator, DataSuite, Experiment, RewardKind};
use crate::model::hub::{self, HubOptions};
use crate::model::qwen::{Critic, Qwen};
use crate::model::tokenizer::Tokenizer;
use crate::model::{init, Params, QwenConfig};
use crate::optim::{AdamW, Gradients};
use crate::parallel;
use crate::rng::SplitMix64;
use crate::rollout::{self, SamplingParams, StopCriteria};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Data(#[from] crate::bench::DataError),
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Run(String),
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

/// Where in the data the next batch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCursor {
    pub epoch: u64,
    pub index: usize,
}

/// `state.json` of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CheckpointState {
    step: usize,
    cursor: DataCursor,
    fingerprint: String,
}

/// The run directory of an experiment under `out_root`.
pub fn run_dir(exp: &Experiment, out_root: &Path) -> PathBuf {
    let scale = format!("{:?}", exp.scale).to_lowercase();
    out_root
        .join(scale)
        .join(format!("{}-{}", exp.name, exp.short_fingerprint()))
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|source| TrainError::Io {
        path: path.to_owned(),
        source,
    })
}

fn to_json<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| TrainError::Run(e.to_string()))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    io(path, crate::atomic::write(path, bytes))
}

/// The order of the training problems in `epoch` (Fisher–Yates on the (seed, epoch) stream).
fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng = SplitMix64::from_key(&[seed, 0xDA7A, epoch]);
        for i in (1..n).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// Takes the next `count` problem indices, moving the cursor (wrapping into the next epoch).
fn next_batch(
    cursor: &mut DataCursor,
    count: usize,
    n: usize,
    seed: u64,
    shuffle: bool,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(count);
    let mut order = epoch_order(n, seed, cursor.epoch, shuffle);
    while out.len() < count {
        if cursor.index >= n {
            cursor.epoch += 1;
            cursor.index = 0;
            order = epoch_order(n, seed, cursor.epoch, shuffle);
        }
        out.push(order[cursor.index]);
        cursor.index += 1;
    }
    out
}

/// One batch of responses laid out for the model: left-padded prompts, right-padded responses.
struct Layout {
    ids: Tensor,       // (N, P + R) u32
    positions: Tensor, // (N, P + R) u32
    valid: Tensor,     // (N, P + R) u8
    targets: Tensor,   // (N, R) u32: the response tokens
    mask: Tensor,      // (N, R) f32
    prompt_len: usize, // P
}

fn layout(
    prompts: &[&Vec<u32>],
    responses: &[&Vec<u32>],
    pad: u32,
    device: &Device,
) -> Result<Layout> {
    let n = prompts.len();
    let p = prompts.iter().map(|x| x.len()).max().unwrap_or(0);
    let r = responses.iter().map(|x| x.len()).max().unwrap_or(0).max(1);
    let (mut ids, mut pos, mut valid, mut targets, mut mask) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (pr, rs) in prompts.iter().zip(responses) {
        let pad_left = p - pr.len();
        ids.extend(std::iter::repeat_n(pad, pad_left).chain(pr.iter().copied()));
        ids.extend(
            rs.iter()
                .copied()
                .chain(std::iter::repeat_n(pad, r - rs.len())),
        );
        pos.extend((0..p + r).map(|j| j.saturating_sub(pad_left) as u32));
        valid.extend((0..p + r).map(|j| u8::from(j >= pad_left && j < p + rs.len())));
        targets.extend(
            rs.iter()
                .copied()
                .chain(std::iter::repeat_n(pad, r - rs.len())),
        );
        mask.extend((0..r).map(|j| if j < rs.len() { 1f32 } else { 0.0 }));
    }
    Ok(Layout {
        ids: Tensor::from_vec(ids, (n, p + r), device)?,
        positions: Tensor::from_vec(pos, (n, p + r), device)?,
        valid: Tensor::from_vec(valid, (n, p + r), device)?,
        targets: Tensor::from_vec(targets, (n, r), device)?,
        mask: Tensor::from_vec(mask, (n, r), device)?,
        prompt_len: p,
    })
}

impl Layout {
    fn rows(&self, start: usize, len: usize) -> Result<Layout> {
        Ok(Layout {
            ids: self.ids.narrow(0, start, len)?,
            positions: self.positions.narrow(0, start, len)?,
            valid: self.valid.narrow(0, start, len)?,
            targets: self.targets.narrow(0, start, len)?,
            mask: self.mask.narrow(0, start, len)?,
            prompt_len: self.prompt_len,
        })
    }

    /// Hidden states that predict the response tokens: positions P−1 … P+R−2.
    fn response_hidden(&self, model: &Qwen) -> Result<Tensor> {
        let (hidden, _) = model.forward_hidden(&self.ids, &self.positions, &self.valid, None)?;
        let r = self.targets.dim(1)?;
        Ok(hidden.narrow(1, self.prompt_len - 1, r)?)
    }
}

/// What one policy micro-batch hands back to be folded, in order, into the mini-batch.
struct MicroOut {
    grads: Gradients,
    pg_loss: f64,
    stats: loss::PolicyStats,
    entropy_sum: f64,
    /// r·Â and the response mask, row by row, when this step records the tails.
    ratio_adv: Option<RowsAndMask>,
}

/// `(B, R)` values and the response mask as rows.
type RowsAndMask = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// Sample-index offset of the difficulty probe's random streams (never a rollout's index).
const PROBE_STREAM: u64 = 1 << 40;

/// Log-prob chunk over positions: bounds the (B, chunk, V) logits.
const LOGIT_CHUNK: usize = 64;

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
    dir: PathBuf,
    device: Device,
}

/// Result of a finished (or stopped) `train` call.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    pub dir: PathBuf,
    pub steps_done: usize,
    pub resumed_from: Option<usize>,
}

impl Trainer {
    /// Builds the trainer for `exp`, writing (or, with `resume`, reopening) its run directory.
    pub fn new(exp: &Experiment, manifest_text: &str, opts: &TrainOptions) -> Result<Trainer> {
        let device = resolve_device(exp.device)?;
        if exp.actor.kl_loss_coef != 0.0 || exp.actor.use_kl_in_reward {
            return Err(TrainError::Run(format!(
                "{}: actor.kl_loss_coef / actor.use_kl_in_reward need a reference policy, which the trainer does not keep (the paper uses neither: set 0 / false)",
                exp.name
            )));
        }
        ensure_model(exp, |_| {})?;
        let model_dir = hub::resolve(&exp.model.source, &opts.hub)?;
        let cfg = QwenConfig::load(&model_dir.join("config.json"))?;
        let tokenizer = Tokenizer::load(&model_dir)?;
        let dtype = crate::model::parse_dtype(exp.model.dtype);
        let policy = Params::load_dir(&model_dir, dtype, &device)?;
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
            DataSuite::Real => bench::load(&bench::dapo::SPEC, &opts.data)?,
            DataSuite::Synthetic => bench::synthetic::train(),
        };
        let mut eos = cfg.eos_token_ids();
        eos.extend(tokenizer.eos_id());
        let dir = run_dir(exp, &opts.out_root);
        let has_ckpt = latest_checkpoint(&dir)?.is_some();
        if dir.join("metrics.jsonl").exists() && !opts.resume && has_ckpt {
            return Err(TrainError::Run(format!(
                "{} already holds this run: pass --resume to continue it (nothing was changed)",
                dir.display()
            )));
        }
        io(&dir, std::fs::create_dir_all(dir.join("checkpoints")))?;
        write_atomic(&dir.join("manifest.yaml"), manifest_text.as_bytes())?;
        write_atomic(&dir.join("fingerprint"), exp.fingerprint().as_bytes())?;
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
            dir,
            device,
        })
    }

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

    /// Runs (or resumes) training; returns when the manifest's steps or `max_steps` are done.
    pub fn run(
        &mut self,
        opts: &TrainOptions,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<TrainSummary> {
        let fp = self.exp.fingerprint();
        let mut cursor = DataCursor { epoch: 0, index: 0 };
        let mut step = 0usize;
        let mut resumed_from = None;
        let mut metrics_lines: Vec<String> = read_lines(&self.dir.join("metrics.jsonl"))?;
        let mut eval_lines: Vec<String> = read_lines(&self.dir.join("eval.jsonl"))?;
        if opts.resume {
            if let Some((ckpt_step, path)) = latest_checkpoint(&self.dir)? {
                let state: CheckpointState =
                    serde_json::from_slice(&io(&path, std::fs::read(path.join("state.json")))?)
                        .map_err(|e| {
                            TrainError::Run(format!("{}: {e}", path.join("state.json").display()))
                        })?;
                if state.fingerprint != fp {
                    return Err(TrainError::Run(format!(
                        "{}: checkpoint of another manifest",
                        path.display()
                    )));
                }
                load_into(&self.policy, &path.join("policy"))?;
                self.actor_opt.load(&path.join("actor_optim.safetensors"))?;
                if let (Some(c), Some(o)) = (&self.critic, &mut self.critic_opt) {
                    load_into(c, &path.join("critic"))?;
                    o.load(&path.join("critic_optim.safetensors"))?;
                }
                cursor = state.cursor;
                step = ckpt_step;
                resumed_from = Some(ckpt_step);
                // Lines written after the checkpoint are recomputed, bit-identically.
                metrics_lines.retain(|l| line_step(l).is_some_and(|s| s <= step));
                eval_lines.retain(|l| line_step(l).is_some_and(|s| s <= step));
            }
        } else {
            metrics_lines.clear();
            eval_lines.clear();
        }
        let total = self.exp.trainer.total_steps;
        let stop_at = opts.max_steps.map_or(total, |m| (step + m).min(total));
        let mut prov = provenance(&self.exp);
        prov.steps_done = step;
        if resumed_from.is_some() {
            // A resumed run keeps the time it first started.
            let old = std::fs::read(self.dir.join("provenance.json")).ok();
            if let Some(old) = old.and_then(|b| serde_json::from_slice::<Provenance>(&b).ok()) {
                prov.started_unix = old.started_unix;
                prov.started_utc = old.started_utc;
            }
        }
        let prov_path = self.dir.join("provenance.json");
        let write_prov = |p: &Provenance| -> Result<()> {
            let json =
                serde_json::to_string_pretty(p).map_err(|e| TrainError::Run(e.to_string()))?;
            write_atomic(&prov_path, json.as_bytes())
        };
        write_prov(&prov)?;
        on_event(Event::Start { step, total });
        if step == 0 && resumed_from.is_none() {
            self.evaluate(0, opts, &mut eval_lines, on_event)?;
        }
        while step < stop_at {
            step += 1;
            let (metrics, tails) = self.train_step(step, &mut cursor)?;
            metrics_lines.push(to_json(&metrics)?);
            write_atomic(
                &self.dir.join("metrics.jsonl"),
                join_lines(&metrics_lines).as_bytes(),
            )?;
            if let Some(t) = tails {
                let dir = self.dir.join("tails");
                io(&dir, std::fs::create_dir_all(&dir))?;
                let json = to_json(&t)?;
                write_atomic(&dir.join(format!("step_{step:06}.json")), json.as_bytes())?;
            }
            on_event(Event::Step {
                step,
                total,
                metrics: &metrics,
            });
            if step.is_multiple_of(self.exp.trainer.eval_every) || step == total {
                self.evaluate(step, opts, &mut eval_lines, on_event)?;
            }
            if step.is_multiple_of(self.exp.trainer.checkpoint_every) || step == stop_at {
                self.checkpoint(step, cursor, &fp)?;
            }
        }
        let end = now_unix();
        prov.steps_done = step;
        prov.finished_unix = Some(end);
        prov.finished_utc = Some(utc(end));
        write_prov(&prov)?;
        // Checksums over everything the run wrote (acpo verify <run dir>).
        crate::archive::write_sums(&self.dir).map_err(|e| TrainError::Run(e.to_string()))?;
        Ok(TrainSummary {
            dir: self.dir.clone(),
            steps_done: step,
            resumed_from,
        })
    }

    /// Evaluates the current policy, appends the summary to `eval.jsonl` (rewritten
    /// atomically) and reports it.
    fn evaluate(
        &self,
        step: usize,
        opts: &TrainOptions,
        eval_lines: &mut Vec<String>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<()> {
        let model = Qwen::new(&self.cfg, &self.policy, true)?;
        let (summary, _) = crate::eval::evaluate(
            &model,
            &self.tokenizer,
            &self.exp,
            &opts.data,
            step,
            |_, _, _| {},
        )?;
        eval_lines.push(to_json(&summary)?);
        write_atomic(
            &self.dir.join("eval.jsonl"),
            join_lines(eval_lines).as_bytes(),
        )?;
        on_event(Event::Eval {
            step,
            weighted_accuracy: summary.weighted_accuracy,
        });
        Ok(())
    }

    fn checkpoint(&self, step: usize, cursor: DataCursor, fp: &str) -> Result<()> {
        let final_dir = self.dir.join("checkpoints").join(format!("step_{step:06}"));
        let tmp = self
            .dir
            .join("checkpoints")
            .join(format!("step_{step:06}.tmp"));
        if tmp.exists() {
            io(&tmp, std::fs::remove_dir_all(&tmp))?;
        }
        io(&tmp, std::fs::create_dir_all(tmp.join("policy")))?;
        init::save_model(&self.cfg, &self.policy, &tmp.join("policy"))?;
        self.actor_opt.save(&tmp.join("actor_optim.safetensors"))?;
        if let (Some(c), Some(o)) = (&self.critic, &self.critic_opt) {
            io(&tmp, std::fs::create_dir_all(tmp.join("critic")))?;
            init::save_model(&self.cfg, c, &tmp.join("critic"))?;
            o.save(&tmp.join("critic_optim.safetensors"))?;
        }
        let state = CheckpointState {
            step,
            cursor,
            fingerprint: fp.to_string(),
        };
        write_atomic(
            &tmp.join("state.json"),
            serde_json::to_string_pretty(&state)
                .map_err(|e| TrainError::Run(e.to_string()))?
                .as_bytes(),
        )?;
        if final_dir.exists() {
            io(&final_dir, std::fs::remove_dir_all(&final_dir))?;
        }
        io(&final_dir, std::fs::rename(&tmp, &final_dir))
    }

    /// One RL step; returns its metrics (verl names) and, at tail steps, the r·Â histograms.
    pub fn train_step(
        &mut self,
        step: usize,
        cursor: &mut DataCursor,
    ) -> Result<(BTreeMap<String, f64>, Option<Tails>)> {
        let t0 = std::time::Instant::now();
        let exp = self.exp.clone();
        let n = exp.rollout.n;
        let indices = next_batch(
            cursor,
            exp.trainer.batch_size,
            self.problems.len(),
            exp.seed,
            exp.data.shuffle,
        );
        let mut prompts = Vec::with_capacity(indices.len());
        for &i in &indices {
            prompts.push(self.prompt(i)?);
        }

        // Rollout: n samples per prompt from the current policy (detached weights).
        let sampler = Qwen::new(&self.cfg, &self.policy, true)?;
        let batch: Vec<Vec<u32>> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), n))
            .collect();
        let keys: Vec<[u64; 4]> = indices
            .iter()
            .flat_map(|&p| (0..n as u64).map(move |s| [exp.seed, step as u64, p as u64, s]))
            .collect();
        let params = SamplingParams {
            temperature: exp.rollout.temperature,
            top_p: exp.rollout.top_p,
            top_k: exp.rollout.top_k,
            max_new_tokens: exp.data.max_response_length,
        };
        let stop = StopCriteria {
            eos_ids: self.eos.clone(),
            ..StopCriteria::default()
        };
        let completions = rollout::generate(
            &sampler,
            &batch,
            &keys,
            &params,
            &stop,
            self.tokenizer.pad_id(),
        )?;
        let t_rollout = t0.elapsed().as_secs_f64();

        // Reward with the verifier.
        let mut scores = Vec::with_capacity(completions.len());
        let mut correct = Vec::with_capacity(completions.len());
        for (k, c) in completions.iter().enumerate() {
            let text = self.tokenizer.decode(&c.tokens, true)?;
            let ok = crate::verify::verify(&self.problems[indices[k / n]].answer, &text).correct;
            correct.push(ok);
            scores.push(match (exp.trainer.reward, ok) {
                (RewardKind::Binary, true) | (RewardKind::Signed, true) => 1.0,
                (RewardKind::Binary, false) => 0.0,
                (RewardKind::Signed, false) => -1.0,
            });
        }
        let group: Vec<usize> = (0..completions.len()).map(|k| k / n).collect();

        // Prompt pass rates for the r·Â tails: from the group (GRPO types), or a probe of k
        // extra samples per prompt (PPO types, n = 1), on their own random streams.
        let tails_due = exp.trainer.tails_every > 0 && step.is_multiple_of(exp.trainer.tails_every);
        let pass_rates: Option<Vec<f64>> = if !tails_due {
            None
        } else if n >= 2 {
            Some(
                correct
                    .chunks(n)
                    .map(|g| g.iter().filter(|c| **c).count() as f64 / n as f64)
                    .collect(),
            )
        } else if exp.trainer.difficulty_probe_k > 0 {
            let k = exp.trainer.difficulty_probe_k;
            let probe: Vec<Vec<u32>> = prompts
                .iter()
                .flat_map(|p| std::iter::repeat_n(p.clone(), k))
                .collect();
            let probe_keys: Vec<[u64; 4]> = indices
                .iter()
                .flat_map(|&p| {
                    (0..k as u64).map(move |s| [exp.seed, step as u64, p as u64, PROBE_STREAM + s])
                })
                .collect();
            let outs = rollout::generate(
                &sampler,
                &probe,
                &probe_keys,
                &params,
                &stop,
                self.tokenizer.pad_id(),
            )?;
            let mut rates = Vec::with_capacity(indices.len());
            for (pi, chunk) in outs.chunks(k).enumerate() {
                let mut ok = 0;
                for c in chunk {
                    let text = self.tokenizer.decode(&c.tokens, true)?;
                    ok += usize::from(
                        crate::verify::verify(&self.problems[indices[pi]].answer, &text).correct,
                    );
                }
                rates.push(ok as f64 / k as f64);
            }
            Some(rates)
        } else {
            None
        };
        let mut tails = pass_rates.as_ref().map(|rates| {
            let mut t = Tails {
                step,
                ..Tails::default()
            };
            for r in rates {
                t.prompts[Difficulty::of(*r) as usize] += 1;
            }
            t
        });

        // Old log-probs (policy) and values (critic), recomputed as verl does.
        let prompt_refs: Vec<&Vec<u32>> = batch.iter().collect();
        let response_refs: Vec<&Vec<u32>> = completions.iter().map(|c| &c.tokens).collect();
        let all = layout(
            &prompt_refs,
            &response_refs,
            self.tokenizer.pad_id(),
            &self.device,
        )?;
        let micro = exp.actor.micro_batch_size;
        let total_rows = completions.len();
        let critic_model = match &self.critic {
            Some(c) => Some(Critic::new(&self.cfg, c, true)?),
            None => None,
        };
        // Micro-batches side by side on the CPU (crate::parallel), folded in order.
        let side_by_side = self.device.is_cpu();
        let olds = parallel::map_micro_batches(
            0..total_rows,
            micro,
            side_by_side,
            |start, len| -> Result<_> {
                let part = all.rows(start, len)?;
                let h = part.response_hidden(&sampler)?;
                let (lp, _) = sampler.token_log_probs(
                    &h,
                    &part.targets,
                    exp.rollout.temperature,
                    LOGIT_CHUNK,
                    false,
                )?;
                let values = match &critic_model {
                    Some(c) => Some(c.values(&part.response_hidden(&c.backbone)?)?),
                    None => None,
                };
                Ok((lp, values))
            },
        );
        let (mut old_lp, mut old_values) = (Vec::new(), Vec::new());
        for r in olds {
            let (lp, values) = r?;
            old_lp.push(lp);
            old_values.extend(values);
        }
        let old_lp = Tensor::cat(&old_lp, 0)?;
        let old_values = if old_values.is_empty() {
            None
        } else {
            Some(Tensor::cat(&old_values, 0)?)
        };

        // Advantages.
        let (advantages, returns) = match exp.algorithm.advantage {
            AdvantageEstimator::Gae { gamma, lam, whiten } => {
                let values = old_values
                    .as_ref()
                    .expect("invariant: PPO types have a critic");
                let token_rewards = advantage::outcome_to_token_rewards(&scores, &all.mask)?;
                let out = advantage::gae(&token_rewards, values, &all.mask, gamma, lam, whiten)?;
                (out.advantages, Some(out.returns))
            }
            AdvantageEstimator::GroupNormalized { norm_by_std } => (
                advantage::grpo(&scores, &group, &all.mask, norm_by_std)?,
                None,
            ),
        };
        let t_prep = t0.elapsed().as_secs_f64();

        // Updates: mini-batches of `mini_batch_size` prompts × n responses, `epochs` passes.
        let mini_rows = exp.actor.mini_batch_size * n;
        let horizon = exp.data.max_response_length;
        let mut stats = loss::PolicyStats::default();
        let (mut pg_loss, mut entropy_sum, mut entropy_tokens) = (0.0, 0.0, 0.0);
        let (mut vf_loss, mut vf_clip, mut vf_tokens) = (0.0, 0.0, 0.0);
        let (mut grad_norms, mut critic_norms) = (Vec::new(), Vec::new());
        let mut updates = 0usize;
        for epoch in 0..exp.actor.epochs {
            for mb_start in (0..total_rows).step_by(mini_rows) {
                let mb_len = mini_rows.min(total_rows - mb_start);
                let mb_mask = all.mask.narrow(0, mb_start, mb_len)?;
                let micro_count = mb_len.div_ceil(micro);
                let agg = loss::Aggregation::new(
                    exp.algorithm.loss_agg_mode,
                    &mb_mask,
                    micro_count,
                    horizon,
                )?;
                let policy = Qwen::new(&self.cfg, &self.policy, false)?;
                let rows = mb_start..mb_start + mb_len;
                let record_tails = epoch == 0 && pass_rates.is_some() && tails.is_some();
                let outs = parallel::map_micro_batches(
                    rows,
                    micro,
                    side_by_side,
                    |ms, len| -> Result<MicroOut> {
                        let part = all.rows(ms, len)?;
                        let h = part.response_hidden(&policy)?;
                        let (lp, ent) = policy.token_log_probs(
                            &h,
                            &part.targets,
                            exp.rollout.temperature,
                            LOGIT_CHUNK,
                            true,
                        )?;
                        let old = old_lp.narrow(0, ms, len)?;
                        let adv = advantages.narrow(0, ms, len)?;
                        let out = loss::policy_loss(
                            &exp.algorithm.clip,
                            &lp,
                            &old,
                            &adv,
                            &part.mask,
                            &agg,
                        )?;
                        // r·Â of each token at the moment its gradient is taken.
                        let ratio_adv = if record_tails {
                            let (_, r) = loss::importance_ratio(&lp.detach(), &old)?;
                            Some(((r * &adv)?.to_vec2::<f32>()?, part.mask.to_vec2::<f32>()?))
                        } else {
                            None
                        };
                        let ent = ent.expect("invariant: entropy was requested");
                        let entropy_sum = (&ent.detach() * &part.mask)?
                            .sum_all()?
                            .to_scalar::<f32>()? as f64;
                        let mut total = out.loss.clone();
                        if exp.actor.entropy_coeff > 0.0 {
                            total = (total
                                - (agg.apply(&ent, &part.mask)? * exp.actor.entropy_coeff)?)?;
                        }
                        Ok(MicroOut {
                            grads: Gradients::from_store(&self.policy, &total.backward()?)?,
                            pg_loss: out.loss.to_scalar::<f32>()? as f64,
                            stats: out.stats,
                            entropy_sum,
                            ratio_adv,
                        })
                    },
                );
                let mut grads = Gradients::default();
                for (i, out) in outs.into_iter().enumerate() {
                    let (ms, out) = (mb_start + i * micro, out?);
                    if let (Some((ra, mask)), Some(rates), Some(t)) =
                        (&out.ratio_adv, &pass_rates, &mut tails)
                    {
                        for (i, (row, m)) in ra.iter().zip(mask).enumerate() {
                            let bucket = t.bucket(Difficulty::of(rates[(ms + i) / n]));
                            row.iter()
                                .zip(m)
                                .filter(|(_, k)| **k != 0.0)
                                .for_each(|(x, _)| bucket.add(*x as f64));
                        }
                    }
                    entropy_sum += out.entropy_sum;
                    entropy_tokens += out.stats.tokens;
                    pg_loss += out.pg_loss;
                    stats = stats.merge(&out.stats);
                    grads.accumulate(out.grads)?;
                }
                grad_norms.push(apply_update(
                    &mut self.actor_opt,
                    &grads,
                    step,
                    "actor/grad_norm",
                )?);
                updates += 1;

                if let (Some(cp), Some(opt), Some(returns), Some(old_v)) =
                    (&self.critic, &mut self.critic_opt, &returns, &old_values)
                {
                    let cliprange = exp.critic.as_ref().map_or(0.5, |c| c.cliprange_value);
                    let critic = Critic::new(&self.cfg, cp, false)?;
                    let rows = mb_start..mb_start + mb_len;
                    let outs = parallel::map_micro_batches(
                        rows,
                        micro,
                        side_by_side,
                        |ms, len| -> Result<_> {
                            let part = all.rows(ms, len)?;
                            let values = critic.values(&part.response_hidden(&critic.backbone)?)?;
                            let out = loss::value_loss(
                                &values,
                                &old_v.narrow(0, ms, len)?,
                                &returns.narrow(0, ms, len)?,
                                &part.mask,
                                cliprange,
                                &agg,
                            )?;
                            let grads = Gradients::from_store(cp, &out.loss.backward()?)?;
                            let loss = out.loss.to_scalar::<f32>()? as f64;
                            Ok((grads, loss, out.clipfrac, out.tokens))
                        },
                    );
                    let mut cgrads = Gradients::default();
                    for out in outs {
                        let (grads, loss, clipfrac, tokens) = out?;
                        vf_loss += loss;
                        vf_clip += clipfrac * tokens;
                        vf_tokens += tokens;
                        cgrads.accumulate(grads)?;
                    }
                    critic_norms.push(apply_update(opt, &cgrads, step, "critic/grad_norm")?);
                }
            }
        }
        let t_update = t0.elapsed().as_secs_f64();

        // Metrics.
        let mut m = BTreeMap::new();
        let mean = |v: &[f64]| {
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        let lengths: Vec<f64> = completions.iter().map(|c| c.tokens.len() as f64).collect();
        m.insert("training/global_step".to_string(), step as f64);
        m.insert(
            "critic/score/mean".into(),
            mean(&scores.iter().map(|&s| s as f64).collect::<Vec<_>>()),
        );
        m.insert(
            "reward/acc/mean".into(),
            mean(
                &correct
                    .iter()
                    .map(|&c| f64::from(u8::from(c)))
                    .collect::<Vec<_>>(),
            ),
        );
        m.insert("response_length/mean".into(), mean(&lengths));
        m.insert(
            "response_length/max".into(),
            lengths.iter().copied().fold(0.0, f64::max),
        );
        m.insert(
            "response_length/clip_ratio".into(),
            mean(
                &completions
                    .iter()
                    .map(|c| f64::from(u8::from(c.finish == rollout::FinishReason::Length)))
                    .collect::<Vec<_>>(),
            ),
        );
        m.insert("actor/pg_loss".into(), pg_loss / updates.max(1) as f64);
        for (k, v) in stats.metrics(&exp.algorithm.clip) {
            m.insert(k.to_string(), v);
        }
        m.insert(
            "actor/entropy".into(),
            entropy_sum / entropy_tokens.max(1.0),
        );
        m.insert("actor/grad_norm".into(), mean(&grad_norms));
        m.insert("actor/lr".into(), exp.actor.optim.lr);
        if self.critic.is_some() {
            m.insert("critic/vf_loss".into(), vf_loss / updates.max(1) as f64);
            m.insert("critic/vf_clipfrac".into(), vf_clip / vf_tokens.max(1.0));
            m.insert("critic/grad_norm".into(), mean(&critic_norms));
            if let (Some(v), Some(r)) = (&old_values, &returns) {
                m.insert(
                    "critic/vf_explained_var".into(),
                    explained_variance(v, r, &all.mask)?,
                );
            }
        }
        for (k, v) in [
            ("timing_s/gen", t_rollout),
            ("timing_s/old_log_prob_and_adv", t_prep - t_rollout),
            ("timing_s/update", t_update - t_prep),
            ("timing_s/step", t0.elapsed().as_secs_f64()),
        ] {
            m.insert(k.into(), v);
        }
        m.insert(
            "perf/tokens_per_s".into(),
            lengths.iter().sum::<f64>() / t0.elapsed().as_secs_f64().max(1e-9),
        );
        for (k, v) in &m {
            if !v.is_finite() && !k.starts_with("timing") {
                return Err(TrainError::NonFinite {
                    step,
                    metric: "a metric",
                    value: *v,
                });
            }
        }
        Ok((m, tails))
    }
}

/// `provenance.json` of a run: where its numbers came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Provenance {
    pub acpo_version: String,
    pub git_commit: String,
    pub crates: BTreeMap<String, String>,
    pub fingerprint: String,
    pub hardware: BTreeMap<String, String>,
    /// Data files and their SHA-256 (checked on load), or the synthetic generator's version.
    pub data: BTreeMap<String, String>,
    pub started_unix: u64,
    pub started_utc: String,
    pub finished_unix: Option<u64>,
    pub finished_utc: Option<String>,
    pub steps_done: usize,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `YYYY-MM-DDThh:mm:ssZ` from Unix seconds (Howard Hinnant's civil-from-days).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn provenance(exp: &Experiment) -> Provenance {
    let crates = env!("ACPO_CRATE_VERSIONS")
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut hardware = BTreeMap::new();
    hardware.insert(
        "os".into(),
        format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
    );
    hardware.insert(
        "threads".into(),
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .to_string(),
    );
    if let Ok(m) = std::fs::read_to_string("/proc/meminfo") {
        if let Some(line) = m.lines().find(|l| l.starts_with("MemTotal")) {
            hardware.insert(
                "memory".into(),
                line.trim_start_matches("MemTotal:").trim().to_string(),
            );
        }
    }
    if let Ok(c) = std::fs::read_to_string("/proc/cpuinfo") {
        if let Some(line) = c.lines().find(|l| l.starts_with("model name")) {
            hardware.insert(
                "cpu".into(),
                line.split(':').nth(1).unwrap_or("").trim().to_string(),
            );
        }
    }
    hardware.insert("device".into(), "cpu".into());
    let mut data = BTreeMap::new();
    match exp.data.suite {
        DataSuite::Real => {
            let d = &bench::dapo::SPEC;
            data.insert(format!("{} v{}", d.file, d.version), d.sha256.to_string());
            for b in &exp.eval.benchmarks {
                let s = bench::spec(*b);
                data.insert(format!("{} v{}", s.file, s.version), s.sha256.to_string());
            }
        }
        DataSuite::Synthetic => {
            data.insert(
                "synthetic task".into(),
                format!(
                    "v{} data seed {}",
                    bench::synthetic::VERSION,
                    bench::synthetic::DATA_SEED
                ),
            );
        }
    }
    let now = now_unix();
    Provenance {
        acpo_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("ACPO_GIT_COMMIT").into(),
        crates,
        fingerprint: exp.fingerprint(),
        hardware,
        data,
        started_unix: now,
        started_utc: utc(now),
        finished_unix: None,
        finished_utc: None,
        steps_done: 0,
    }
}

/// The device a manifest asks for. `cuda` needs a binary built with the `cuda` feature and a
/// visible GPU; `auto` falls back to the CPU.
pub fn resolve_device(d: crate::manifest::Device) -> Result<Device> {
    use crate::manifest::Device as D;
    match d {
        D::Cpu => Ok(Device::Cpu),
        D::Cuda => {
            if cfg!(feature = "cuda") {
                Device::new_cuda(0).map_err(|e| TrainError::Run(format!("device cuda: {e}")))
            } else {
                Err(TrainError::Run(
                    "device: cuda, but this binary was built without CUDA (cargo build --release --features cuda, see ../shared/CUDA.md); use device: cpu or auto".into(),
                ))
            }
        }
        D::Auto => Ok(if cfg!(feature = "cuda") {
            Device::new_cuda(0).unwrap_or(Device::Cpu)
        } else {
            Device::Cpu
        }),
    }
}

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
pub fn init_fingerprint(init: &crate::manifest::ModelInitSpec) -> Result<String> {
    let text = io(&init.config, std::fs::read_to_string(&init.config))?;
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| TrainError::Run(format!("{}: not JSON: {e}", init.config.display())))?;
    let key = serde_json::json!({
        "config": config, "seed": init.seed, "tokenizer": init.tokenizer,
        "warm_start": init.warm_start, "synthetic": bench::synthetic::VERSION,
    });
    Ok(crate::manifest::hex(
        &<sha2::Sha256 as sha2::Digest>::digest(to_json(&key)?.as_bytes()),
    ))
}

/// Creates a missing model directory from the manifest's `model.init` (smoke and mini scales):
/// random weights, a tokenizer, then the warm start. It is built under a temporary name and
/// renamed when complete, so an interrupted build is never mistaken for a model. An existing
/// directory is reused only if its `init.json` has this manifest's fingerprint and its files
/// match their SHA256SUMS: a cache keyed by fingerprint, checked on every use.
pub fn ensure_model(exp: &Experiment, mut on_event: impl FnMut(Event<'_>)) -> Result<()> {
    let (dir, init) = match (&exp.model.source, &exp.model.init) {
        (crate::manifest::ModelSource::Dir(dir), Some(init)) => (dir, init),
        _ => return Ok(()),
    };
    let fp = init_fingerprint(init)?;
    if dir.exists() {
        return check_created_model(dir, &fp);
    }
    let name = dir
        .file_name()
        .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.with_file_name(format!("{name}.partial"));
    if tmp.exists() {
        io(&tmp, std::fs::remove_dir_all(&tmp))?;
    }
    let params = init::write_random_model(&init.config, &tmp, init.seed)?;
    let cfg = QwenConfig::load(&tmp.join("config.json"))?;
    let tokenizer_vocab = match init.tokenizer {
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
            let device = resolve_device(exp.device)?;
            let tokenizer = Tokenizer::load(&tmp)?;
            let dtype = crate::model::parse_dtype(exp.model.dtype);
            let params = Params::load_dir(&tmp, dtype, &device)?;
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
            Some(serde_json::to_value(&report).map_err(|e| TrainError::Run(e.to_string()))?)
        }
    };
    let record = InitRecord {
        fingerprint: fp,
        init: serde_json::to_value(init).map_err(|e| TrainError::Run(e.to_string()))?,
        parameters: params.count(),
        tokenizer_vocab,
        warm_start: warm,
        created_utc: utc(now_unix()),
    };
    write_atomic(&tmp.join("init.json"), to_json(&record)?.as_bytes())?;
    crate::archive::write_sums(&tmp).map_err(|e| TrainError::Run(e.to_string()))?;
    io(dir, std::fs::rename(&tmp, dir))
}

fn check_created_model(dir: &Path, fp: &str) -> Result<()> {
    let path = dir.join("init.json");
    let record: InitRecord = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| TrainError::Run(format!("{}: {e}", path.display())))?,
        Err(_) => {
            return Err(TrainError::Run(format!(
                "{} exists but was not created by model.init (no init.json): remove it to create it, or drop model.init to use it as it is",
                dir.display()
            )))
        }
    };
    if record.fingerprint != fp {
        return Err(TrainError::Run(format!(
            "{} was created by a different model.init (fingerprint {}, this manifest's is {}): remove it to create it anew, or point model.dir elsewhere",
            dir.display(),
            &record.fingerprint[..12.min(record.fingerprint.len())],
            &fp[..12]
        )));
    }
    let report = crate::archive::verify_dir(dir).map_err(|e| TrainError::Run(e.to_string()))?;
    if !report.ok() {
        return Err(TrainError::Run(format!(
            "{}: files do not match its SHA256SUMS ({}): remove it to create it anew",
            dir.display(),
            report.describe()
        )));
    }
    Ok(())
}

/// One optimizer step; a non-finite gradient norm stops the run (nothing was applied).
fn apply_update(
    opt: &mut AdamW,
    grads: &Gradients,
    step: usize,
    metric: &'static str,
) -> Result<f64> {
    let report = opt.step(grads)?;
    if !report.applied {
        return Err(TrainError::NonFinite {
            step,
            metric,
            value: report.grad_norm,
        });
    }
    Ok(report.grad_norm)
}

/// 1 − Var(R − V)/Var(R) over valid tokens (verl's `critic/vf_explained_var`).
fn explained_variance(values: &Tensor, returns: &Tensor, mask: &Tensor) -> Result<f64> {
    let v = values
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let r = returns
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let m = mask.flatten_all()?.to_vec1::<f32>()?;
    let pairs: Vec<(f64, f64)> = v
        .iter()
        .zip(&r)
        .zip(&m)
        .filter(|(_, k)| **k != 0.0)
        .map(|((a, b), _)| (*a as f64, *b as f64))
        .collect();
    let var = |xs: &[f64]| {
        let mu = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        xs.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / xs.len().max(1) as f64
    };
    let rs: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let diff: Vec<f64> = pairs.iter().map(|p| p.1 - p.0).collect();
    let vr = var(&rs);
    Ok(if vr > 0.0 { 1.0 - var(&diff) / vr } else { 0.0 })
}

/// One line describing a step, for logs and progress displays.
pub fn step_line(step: usize, total: usize, m: &BTreeMap<String, f64>) -> String {
    let g = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    format!(
        "step {step}/{total}  acc {:.3}  len {:.1}  pg_loss {:+.4}  entropy {:.3}  grad_norm {:.3}  {:.1}s",
        g("reward/acc/mean"),
        g("response_length/mean"),
        g("actor/pg_loss"),
        g("actor/entropy"),
        g("actor/grad_norm"),
        g("timing_s/step")
    )
}

fn read_lines(path: &Path) -> Result<Vec<String>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    Ok(io(path, std::fs::read_to_string(path))?
        .lines()
        .map(String::from)
        .collect())
}

fn join_lines(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// The step recorded in a metrics or eval line.
fn line_step(line: &str) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.get("training/global_step")
        .or_else(|| v.get("step"))
        .and_then(|s| s.as_f64())
        .map(|s| s as usize)
}

/// The newest complete checkpoint (`step_NNNNNN`, never a `.tmp` one).
pub fn latest_checkpoint(dir: &Path) -> Result<Option<(usize, PathBuf)>> {
    let ckpts = dir.join("checkpoints");
    if !ckpts.exists() {
        return Ok(None);
    }
    let mut best = None;
    for entry in io(&ckpts, std::fs::read_dir(&ckpts))? {
        let entry = io(&ckpts, entry)?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(n) = name
            .strip_prefix("step_")
            .and_then(|s| s.parse::<usize>().ok())
        {
            if entry.path().join("state.json").exists() && best.as_ref().is_none_or(|(b, _)| n > *b)
            {
                best = Some((n, entry.path()));
            }
        }
    }
    Ok(best)
}

/// Overwrites the values of `params` with those saved in `dir` (same names and shapes).
fn load_into(params: &Params, dir: &Path) -> Result<()> {
    let (_, first) = params
        .vars()
        .next()
        .ok_or_else(|| TrainError::Run("no parameters".into()))?;
    let loaded = Params::load_dir(dir, first.dtype(), first.device())?;
    for (name, var) in params.vars() {
        let t = loaded.get(name, var.dims())?;
        var.set(&t)?;
    }
    Ok(())
}
