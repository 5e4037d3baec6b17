//! `acpo reproduce`: bring a scale's results up to date, then build the artifact.
//!
//! The plan ([`plan`]) is a value: which runs are finished (reused), which resume from their
//! last checkpoint, which start fresh, and which created models (warm starts) are made first —
//! once per distinct model, since several runs share one. [`train_all`] carries it out with
//! `jobs` runs side by side; [`from_archive`] instead verifies an archive and unpacks it, so the
//! artifacts are rebuilt from published results without training.

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::archive::{self, ArchiveError};
use crate::data::DataLocation;
use crate::hub::HubOptions;
use crate::manifest::{Experiment, ManifestError};
use crate::model::spec::Device;
use crate::run::RunDir;
use crate::train::{self, TrainError, TrainOptions, Trainer};

#[derive(Debug, thiserror::Error)]
pub enum ReproduceError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Boxed: a training error is large, and this one travels through the job queue.
    #[error(transparent)]
    Train(Box<TrainError>),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{}: no manifests for this scale", dir.display())]
    NoManifests { dir: PathBuf },
    #[error("--jobs must be at least 1")]
    NoJobs,
    #[error("--seeds must be at least 1")]
    NoSeeds,
    #[error("--seeds {seeds}: {manifests} manifests × {seeds} seeds come to more than the {MAX_RUNS} runs one reproduction plans")]
    TooManyRuns { seeds: usize, manifests: usize },
    #[error("--models: no manifest of this scale trains {wanted} (its models: {have})")]
    NoSuchModel { wanted: String, have: String },
    #[error(transparent)]
    Runs(#[from] crate::run::complete::RunsError),
    #[error("{}: no run of the manifests in {} (a report --from an archive is checked against the scale's manifests: --experiments DIR)", root.display(), manifests.display())]
    NoRunsOfScale { root: PathBuf, manifests: PathBuf },
    #[error("{} is being written by another `--from` (it holds {}); nothing was changed", dir.display(), lock.display())]
    Busy { dir: PathBuf, lock: PathBuf },
    #[error("{}: run {name} has seed {seed}, more seeds past its manifest's than the {MAX_RUNS} runs one reproduction plans", root.display())]
    SeedsBeyondPlan {
        root: PathBuf,
        name: String,
        seed: u64,
    },
}

type Result<T> = std::result::Result<T, ReproduceError>;

/// The most runs one reproduction or one sweep spec may plan (issue #35): the paper's table is 16
/// runs, the powered mini job 160, the study's largest sweep 54; beyond this, planning alone
/// takes minutes and gigabytes before anything is trained.
pub const MAX_RUNS: usize = 4096;

impl From<TrainError> for ReproduceError {
    fn from(e: TrainError) -> Self {
        ReproduceError::Train(Box::new(e))
    }
}

/// What is to be done for a scale's runs (indices into its manifests).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Finished earlier with this manifest: reused as they are.
    pub reused: Vec<usize>,
    /// Runs whose created model is made (or checked) before any run trains, one per model.
    pub models: Vec<usize>,
    /// Runs to train: with the step of their last checkpoint (resumed), or None (fresh).
    pub runs: Vec<(usize, Option<usize>)>,
}

/// How far a run got: the step of its last complete checkpoint, and whether it was sealed
/// afterwards ([`RunDir::is_sealed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub checkpoint: Option<usize>,
    pub sealed: bool,
}

/// The plan for `exps` given how far each run got. A run is reused only when its last
/// checkpoint is the final step and it was sealed; one killed before its seal resumes at its
/// last step (no training, then provenance and SHA256SUMS).
pub fn plan(exps: &[Experiment], progress: &[Progress]) -> Plan {
    let mut p = Plan::default();
    for (i, (exp, got)) in exps.iter().zip(progress).enumerate() {
        let done = got.checkpoint;
        if done == Some(exp.trainer.total_steps) && got.sealed {
            p.reused.push(i);
        } else {
            p.runs.push((i, done));
        }
    }
    for &(i, _) in &p.runs {
        let model = &exps[i].model;
        let seen = p
            .models
            .iter()
            .any(|&j| exps[j].model.source == model.source);
        if model.init.is_some() && !seen {
            p.models.push(i);
        }
    }
    p
}

/// Runs trained at once: the flag, else one per CPU when every run is on the CPU (at mini sizes
/// a second run side by side doubles throughput), else one.
pub fn jobs(asked: Option<usize>, exps: &[Experiment]) -> Result<usize> {
    let all_cpu = exps.iter().all(|e| e.device == Device::Cpu);
    match asked {
        Some(0) => Err(ReproduceError::NoJobs),
        Some(j) => Ok(j),
        None if all_cpu => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        None => Ok(1),
    }
}

/// The manifests among `manifests` whose model (as reports name it: `qwen3-mini-xs`,
/// `Qwen/Qwen3-1.7B`) is one of `models`, in their order; every name must match one (a typo
/// is an error listing the scale's models, never a silent empty run). Empty `models`: all.
pub fn select_models(manifests: &[PathBuf], models: &[String]) -> Result<Vec<PathBuf>> {
    if models.is_empty() {
        return Ok(manifests.to_vec());
    }
    let mut labelled = Vec::new();
    for path in manifests {
        labelled.push((path.clone(), Experiment::load(path)?.model.source.label()));
    }
    for wanted in models {
        if !labelled.iter().any(|(_, m)| m == wanted) {
            let mut have: Vec<&str> = labelled.iter().map(|(_, m)| m.as_str()).collect();
            have.sort_unstable();
            have.dedup();
            return Err(ReproduceError::NoSuchModel {
                wanted: wanted.clone(),
                have: have.join(", "),
            });
        }
    }
    Ok(labelled
        .into_iter()
        .filter(|(_, m)| models.contains(m))
        .map(|(p, _)| p)
        .collect())
}

/// The runs of `manifests` with `seeds` seeds each: a manifest's own seed s, then s + 1, …,
/// s + seeds − 1 ([`Experiment::with_seed`]), with the manifest text each run keeps.
pub fn seeded(manifests: &[PathBuf], seeds: usize) -> Result<Vec<(Experiment, String)>> {
    if seeds == 0 {
        return Err(ReproduceError::NoSeeds);
    }
    if manifests.len().saturating_mul(seeds) > MAX_RUNS {
        return Err(ReproduceError::TooManyRuns {
            seeds,
            manifests: manifests.len(),
        });
    }
    let mut out = Vec::new();
    for path in manifests {
        let exp = Experiment::load(path)?;
        let text = crate::files::read_to_string(path).at(path)?;
        out.extend(exp.seeds(&text, seeds, path)?);
    }
    Ok(out)
}

/// Trains every run of `manifests` (with `seeds` seeds each: [`seeded`]) that is not finished
/// under `results`, following [`plan`]: first the distinct created models, then the runs,
/// `jobs` at a time. The first error stops the queue (running jobs finish their run) and is
/// returned.
pub fn train_all(
    manifests: &[PathBuf],
    seeds: usize,
    results: &Path,
    data: &DataLocation,
    asked_jobs: Option<usize>,
) -> Result<()> {
    let runs = seeded(manifests, seeds)?
        .into_iter()
        .map(|(exp, text)| Job {
            exp,
            text,
            results: results.to_owned(),
        })
        .collect();
    train_runs(runs, data, asked_jobs)
}

/// One run for [`train_runs`]: its experiment, the manifest text its directory keeps, and the
/// results root its directory goes under.
#[derive(Debug, Clone)]
pub struct Job {
    pub exp: Experiment,
    pub text: String,
    pub results: PathBuf,
}

/// Trains every run of `runs` that is not finished under its results root, as [`train_all`]
/// does: what `reproduce` and `sweep` share.
pub fn train_runs(runs: Vec<Job>, data: &DataLocation, asked_jobs: Option<usize>) -> Result<()> {
    let several_seeds = {
        let names: std::collections::HashSet<&str> =
            runs.iter().map(|j| j.exp.name.as_str()).collect();
        names.len() < runs.len()
    };
    let (exps, places): (Vec<Experiment>, Vec<(String, PathBuf)>) = runs
        .into_iter()
        .map(|j| (j.exp, (j.text, j.results)))
        .unzip();
    let label = |exp: &Experiment| {
        if several_seeds {
            format!("{} (seed {})", exp.name, exp.seed)
        } else {
            exp.name.clone()
        }
    };
    let jobs = jobs(asked_jobs, &exps)?;
    if jobs > 1 && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // Read by rayon and candle when their pools start (not yet: nothing ran a kernel).
        std::env::set_var("CANDLE_NUM_THREADS", "1");
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let started = Instant::now();
    let mut progress = Vec::new();
    for (exp, (_, results)) in exps.iter().zip(&places) {
        let run = RunDir::of(exp, results);
        progress.push(Progress {
            checkpoint: run.latest_checkpoint().at(run.path())?.map(|c| c.0),
            sealed: run.is_sealed(),
        });
    }
    let plan = plan(&exps, &progress);
    let total = exps.len();
    for &i in &plan.reused {
        println!(
            "[{}/{total}] {}: finished earlier, reused",
            i + 1,
            label(&exps[i])
        );
    }
    let queue = Queue::new(jobs);
    let parallel = jobs > 1;
    queue.run(plan.models.len(), &|k| {
        let exp = &exps[plan.models[k]];
        train::ensure_model(
            exp,
            crate::progress::display(parallel.then(|| exp.name.clone())),
        )?;
        Ok(())
    })?;
    if !plan.models.is_empty() {
        println!(
            "models ready ({} created or checked) after {:.1} min",
            plan.models.len(),
            started.elapsed().as_secs_f64() / 60.0
        );
    }
    let finished = AtomicUsize::new(0);
    let runs_started = Instant::now();
    let start_evals = std::sync::Arc::new(crate::train::StartEvals::new());
    queue.run(plan.runs.len(), &|k| {
        let (i, done) = plan.runs[k];
        let (exp, (text, results)) = (&exps[i], &places[i]);
        let what = if done.is_some() {
            "resuming"
        } else {
            "training"
        };
        println!("[{}/{total}] {}: {what}", i + 1, label(exp));
        let opts = TrainOptions {
            out_root: results.to_owned(),
            resume: done.is_some(),
            max_steps: None,
            data: data.clone(),
            hub: HubOptions::from_env(),
            start_evals: Some(start_evals.clone()),
        };
        let mut display = crate::progress::display(parallel.then(|| label(exp)));
        Trainer::new(exp, text, &opts)?.run(&opts, &mut display)?;
        let n = finished.fetch_add(1, Ordering::SeqCst) + 1;
        let elapsed = runs_started.elapsed().as_secs_f64();
        println!(
            "[{}/{total}] {} done; {n} of {} runs in {:.1} min, about {:.1} min to go",
            i + 1,
            label(exp),
            plan.runs.len(),
            elapsed / 60.0,
            elapsed / n as f64 * (plan.runs.len() - n) as f64 / 60.0
        );
        Ok(())
    })?;
    let (evaluated, reused) = start_evals.counts();
    println!(
        "trained {} runs ({jobs} jobs) in {:.1} min; {evaluated} step-0 evaluations made, {reused} taken from a run with the same start model, evaluation and seed",
        plan.runs.len(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

/// `jobs` worker threads that take the next index when free; the first error stops them.
struct Queue {
    jobs: usize,
}

impl Queue {
    fn new(jobs: usize) -> Queue {
        Queue { jobs }
    }

    /// Runs f(0), …, f(n − 1); returns the first error.
    fn run(&self, n: usize, f: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<ReproduceError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..self.jobs.min(n) {
                scope.spawn(|| loop {
                    if failed.load(Ordering::SeqCst) {
                        return;
                    }
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    if k >= n {
                        return;
                    }
                    if let Err(e) = f(k) {
                        failed.store(true, Ordering::SeqCst);
                        first_error.lock().expect("lock").get_or_insert(e);
                        return;
                    }
                });
            }
        });
        match first_error.into_inner().expect("lock") {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The runs a report `--from` finished runs stands on ([`check_finished`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The scale's manifests of the models the runs are of.
    pub manifests: usize,
    /// Seeds per manifest.
    pub seeds: usize,
    /// Runs: manifests × seeds, every one there and complete.
    pub runs: usize,
}

impl Expected {
    pub fn describe(&self) -> String {
        format!(
            "all {} runs the report expects are there and complete ({} manifests × {} seeds)",
            self.runs, self.manifests, self.seeds
        )
    }
}

/// Checks that the finished runs in `root` are what a report of the scale expects (issue #47),
/// as `sweep --from` checks a sweep's ([`crate::run::complete::expect`], the one rule): the
/// scale's `manifests` of every model `root` holds runs of, at `seeds` seeds each — not given:
/// at as many as `root` holds of any of them (seed s, s + 1, … of each manifest's own s) — are
/// all there and complete, and `root` holds no other run, since the report reads every run there.
/// So a run removed, cut short or emptied, a missing seed or a missing pair is refused, naming
/// it, instead of reported over fewer runs than the report says.
pub fn check_finished(
    manifests: &[PathBuf],
    seeds: Option<usize>,
    root: &Path,
    experiments: &Path,
) -> Result<Expected> {
    use crate::run::complete;
    let found = complete::runs_in(root)?;
    let mut loaded = Vec::new();
    for path in manifests {
        loaded.push((path.clone(), Experiment::load(path)?));
    }
    // How many seeds `root` holds of a manifest: up to its furthest one.
    let held = |exp: &Experiment| {
        found
            .iter()
            .filter(|f| f.exp.name == exp.name)
            .filter_map(|f| f.exp.seed.checked_sub(exp.seed).map(|k| (k, f)))
            .max_by_key(|(k, _)| *k)
    };
    let models: std::collections::BTreeSet<String> = loaded
        .iter()
        .filter(|(_, e)| held(e).is_some())
        .map(|(_, e)| e.model.source.label())
        .collect();
    if models.is_empty() {
        return Err(ReproduceError::NoRunsOfScale {
            root: root.to_owned(),
            manifests: experiments.to_owned(),
        });
    }
    let selected: Vec<&(PathBuf, Experiment)> = loaded
        .iter()
        .filter(|(_, e)| models.contains(&e.model.source.label()))
        .collect();
    let seeds = match seeds {
        Some(n) => n,
        None => {
            let (k, furthest) = selected
                .iter()
                .filter_map(|(_, e)| held(e))
                .max_by_key(|(k, _)| *k)
                .expect("invariant: a selected model has a run");
            usize::try_from(k)
                .ok()
                .and_then(|k| k.checked_add(1))
                .filter(|n| n.saturating_mul(selected.len()) <= MAX_RUNS)
                .ok_or_else(|| ReproduceError::SeedsBeyondPlan {
                    root: root.to_owned(),
                    name: furthest.exp.name.clone(),
                    seed: furthest.exp.seed,
                })?
        }
    };
    let paths: Vec<PathBuf> = selected.iter().map(|(p, _)| p.clone()).collect();
    let expected: Vec<Experiment> = seeded(&paths, seeds)?.into_iter().map(|(e, _)| e).collect();
    let refs: Vec<&Experiment> = expected.iter().collect();
    complete::expect(&refs, root, complete::Others::Refused)?;
    Ok(Expected {
        manifests: paths.len(),
        seeds,
        runs: expected.len(),
    })
}

/// A verified archive (or results directory) ready to report from: the reports are written into
/// [`FromArchive::root`], then [`FromArchive::commit`] puts them in place with the runs.
#[derive(Debug)]
pub struct FromArchive {
    pub verification: archive::Report,
    /// The directory holding the run directories, where the reports are written; None when
    /// verification failed. For an archive it is a staging directory until the commit.
    pub root: Option<PathBuf>,
    /// An archive's staging directory and where it goes.
    staged: Option<(crate::atomic::StagedDir, PathBuf)>,
    /// Held until the reports are in place: one `--from` at a time writes into a folder.
    _lock: crate::run::lock::Lock,
}

impl FromArchive {
    /// Where `path` (under [`FromArchive::root`]) will be once committed.
    pub fn final_path(&self, path: &Path) -> PathBuf {
        match (&self.staged, &self.root) {
            (Some((_, dest)), Some(root)) => match path.strip_prefix(root) {
                Ok(rest) if rest.as_os_str().is_empty() => dest.clone(),
                Ok(rest) => dest.join(rest),
                Err(_) => path.to_owned(),
            },
            _ => path.to_owned(),
        }
    }

    /// Puts an archive's unpacked runs and the reports written beside them at
    /// `<results>/from-<stem>/`, replacing what an earlier call put there, as one rename; returns
    /// where they are (a directory given as `--from` stays where it is). Called once every
    /// check passed and every report is written: a call that fails before leaves the earlier
    /// folder, reports and all, as it was.
    pub fn commit(self) -> Result<Option<PathBuf>> {
        let Some(root) = self.root else {
            return Ok(None);
        };
        match self.staged {
            Some((stage, dest)) => {
                crate::atomic::commit_dir(&root, &dest).at(&dest)?;
                drop(stage);
                Ok(Some(dest))
            }
            None => Ok(Some(root)),
        }
    }
}

/// Locks `dir` for one `--from` ([`crate::run::lock`], as a run is locked for its trainer).
fn lock_from(dir: &Path) -> Result<crate::run::lock::Lock> {
    use crate::run::lock;
    let path = lock::path_for(dir);
    lock::acquire(dir, lock::Wait::NoWait)
        .at(&path)?
        .ok_or_else(|| ReproduceError::Busy {
            dir: dir.to_owned(),
            lock: path,
        })
}

/// Verifies `from` and makes it ready to report from ([`FromArchive`]). An archive is unpacked
/// (once: what is verified is what is used) into a staging directory beside
/// `<results>/from-<stem>/`, which the commit puts in its place, so no run of an earlier archive
/// of that name is mixed in and a failing call leaves the earlier one whole. Either way the
/// folder is locked until the commit: a second `--from` into it is refused.
pub fn from_archive(from: &Path, results: &Path) -> Result<FromArchive> {
    if from.is_dir() {
        let real = std::fs::canonicalize(from).at(from)?;
        let lock = lock_from(&real)?;
        let verification = archive::verify(from)?;
        let root = verification.ok().then(|| from.to_owned());
        return Ok(FromArchive {
            verification,
            root,
            staged: None,
            _lock: lock,
        });
    }
    if !from.exists() {
        return Err(ArchiveError::Invalid {
            path: from.to_owned(),
            reason: "no such archive or directory".into(),
        }
        .into());
    }
    // A pipe or a device is refused before anything is made for it.
    crate::files::regular(from).at(from)?;
    let stem = from
        .file_name()
        .map_or("archive".into(), |s| s.to_string_lossy().to_string());
    let stem = stem
        .strip_suffix(".tar.gz")
        .or_else(|| stem.strip_suffix(".tgz"))
        .unwrap_or(&stem)
        .to_string();
    let dest = results.join(format!("from-{stem}"));
    std::fs::create_dir_all(results).at(results)?;
    let lock = lock_from(&dest)?;
    let stage = crate::atomic::StagedDir::new(&dest, "unpacking").at(&dest)?;
    // Under the staging directory with the folder's own name: the figures of a report are
    // named after the folder its runs are in.
    let root = stage.path().join(format!("from-{stem}"));
    std::fs::create_dir(&root).at(&root)?;
    let verification = archive::verify_into(from, &root)?;
    let ok = verification.ok();
    Ok(FromArchive {
        verification,
        root: ok.then_some(root),
        staged: ok.then_some((stage, dest)),
        _lock: lock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::ModelSource;

    /// The four smoke runs: they share one created model.
    fn smoke() -> Vec<Experiment> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/smoke");
        ["smoke-ppo", "smoke-ppo-ac", "smoke-grpo", "smoke-grpo-ac"]
            .iter()
            .map(|n| Experiment::load(&dir.join(format!("{n}.yaml"))).expect("smoke manifest"))
            .collect()
    }

    #[test]
    fn a_fresh_scale_trains_every_run_after_making_its_shared_model_once() {
        let exps = smoke();
        let p = plan(&exps, &[Progress::default(); 4]);
        assert_eq!(p.reused, Vec::<usize>::new());
        assert_eq!(p.models, vec![0]);
        assert_eq!(p.runs, vec![(0, None), (1, None), (2, None), (3, None)]);
    }

    #[test]
    fn finished_runs_are_reused_and_unfinished_ones_resume_from_their_checkpoint() {
        let exps = smoke();
        let total = exps[1].trainer.total_steps;
        let at = |step: usize, sealed: bool| Progress {
            checkpoint: Some(step),
            sealed,
        };
        let p = plan(
            &exps,
            &[
                Progress::default(),
                at(total, true),
                at(1, false),
                at(total, true),
            ],
        );
        assert_eq!(p.reused, vec![1, 3]);
        assert_eq!(p.runs, vec![(0, None), (2, Some(1))]);
        // The model is made before the first run that still trains.
        assert_eq!(p.models, vec![0]);
    }

    #[test]
    fn a_model_is_made_once_per_distinct_source_and_never_for_a_given_one() {
        let mut exps = smoke();
        exps[2].model.source = ModelSource::Dir("models/other".into());
        exps[3].model.init = None;
        exps[3].model.source = ModelSource::Dir("models/given".into());
        let p = plan(&exps, &[Progress::default(); 4]);
        assert_eq!(p.models, vec![0, 2]);
        let all_done: Vec<Progress> = exps
            .iter()
            .map(|e| Progress {
                checkpoint: Some(e.trainer.total_steps),
                sealed: true,
            })
            .collect();
        assert_eq!(plan(&exps, &all_done).models, Vec::<usize>::new());
    }

    /// Issue #17, item 6: a run killed after its final checkpoint but before its seal is
    /// resumed (which only seals it), never reused as finished.
    #[test]
    fn a_final_checkpoint_without_the_seal_resumes_instead_of_being_reused() {
        let exps = smoke();
        let total = exps[0].trainer.total_steps;
        let unsealed = Progress {
            checkpoint: Some(total),
            sealed: false,
        };
        let p = plan(&exps, &[unsealed; 4]);
        assert_eq!(p.reused, Vec::<usize>::new());
        assert_eq!(p.runs[0], (0, Some(total)));
    }

    #[test]
    fn jobs_default_to_the_cpus_for_cpu_runs_and_refuse_zero() {
        let mut exps = smoke();
        assert!(jobs(None, &exps).expect("jobs") >= 1);
        assert_eq!(jobs(Some(3), &exps).expect("jobs"), 3);
        assert!(matches!(jobs(Some(0), &exps), Err(ReproduceError::NoJobs)));
        exps[0].device = Device::Auto;
        assert_eq!(jobs(None, &exps).expect("jobs"), 1);
    }
}
