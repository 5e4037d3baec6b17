//! What a sweep's runs measured: each finished run's outcome, found by its manifest's
//! fingerprint, and per grid point the paired differences to its baseline over seeds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{GridValue, Result, Sweep, Variant};
use crate::algo::clip::PolicyClip;
use crate::algo::method::AlgorithmKind;
use crate::manifest::Experiment;
use crate::report::seeds::Interval;

/// What a sweep's report reads of a finished run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Best and final (last evaluation's) weighted accuracy, as fractions.
    pub best: f64,
    pub last: f64,
    /// The share of update tokens its own clip acted on, averaged over its steps
    /// ([`PolicyClip::own_clip_metric`]).
    pub own_clip: Option<f64>,
}

/// Each finished run's outcome, by the fingerprint of the manifest its directory holds: a run
/// is found by what it ran, whatever its directory is called (issue #35: two directories
/// swapped in an archive are reported under their own grid points).
pub type Finished = BTreeMap<String, Outcome>;

/// The finished runs in `dirs`, each a directory of run directories (missing ones skipped).
pub fn finished(dirs: &[PathBuf]) -> Result<Finished> {
    let mut out = Finished::new();
    for dir in dirs.iter().filter(|d| d.exists()) {
        for r in crate::report::load_results(dir)? {
            let best = r.best().map(|e| e.weighted_accuracy);
            let last = r.evals.iter().max_by_key(|e| e.step);
            if let (Some(best), Some(last)) = (best, last) {
                let key = r.clip.own_clip_metric();
                let clips: Vec<f64> = crate::report::load_metrics(&r.dir)?
                    .iter()
                    .filter_map(|m| m.get(key).copied())
                    .collect();
                let own_clip =
                    (!clips.is_empty()).then(|| clips.iter().sum::<f64>() / clips.len() as f64);
                out.insert(
                    r.fingerprint.clone(),
                    Outcome {
                        best,
                        last: last.weighted_accuracy,
                        own_clip,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// The directories that hold the sweeps' runs once trained under `sweeps`
/// (`<results>/sweeps/`): each home's scale directory.
pub fn trained_dirs(sweeps: &[Sweep], root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = sweeps
        .iter()
        .flat_map(|s| {
            s.variants.iter().filter_map(move |v| {
                crate::run::RunDir::of(&v.exp, &s.home(v, root))
                    .path()
                    .parent()
                    .map(Path::to_owned)
            })
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// One grid point's results: its values, and per seed its and its baseline's accuracies.
#[derive(Debug, Clone)]
pub struct PointResult {
    pub values: Vec<(String, GridValue)>,
    /// The rule the point trains, e.g. `GRPO-AC alpha=0.5` or `GRPO cispo eps=10/0.2`.
    pub rule: String,
    /// Its method and clip, typed (the figures colour a rule by them).
    pub kind: AlgorithmKind,
    pub clip: PolicyClip,
    /// Policy updates per training step (mini-batches × epochs): the off-policy degree.
    pub updates_per_step: usize,
    /// The paired baseline's method and manifest name, e.g. `GRPO (study-xs-grpo)`.
    pub baseline: Option<String>,
    /// Best weighted accuracy of the point's runs and of their baselines, and the baselines'
    /// final, in points.
    pub best: Option<Interval>,
    pub baseline_best: Option<Interval>,
    pub baseline_final: Option<Interval>,
    /// How often the point's own clip acted and its baseline's, in % of update tokens (the
    /// mean over steps, then over seeds).
    pub own_clip: Option<Interval>,
    pub baseline_clip: Option<Interval>,
    /// Paired by seed: the point's minus its baseline's, in points.
    pub delta_best: Option<Interval>,
    pub delta_final: Option<Interval>,
    pub seeds: usize,
}

/// The sweep's table: per grid point, its best accuracy and the paired differences to the
/// baseline over seeds (Student's t, as `seeds.md`), from the runs `finished` has.
pub fn point_results(sweep: &Sweep, finished: &Finished) -> Vec<PointResult> {
    let load = |v: &Variant| finished.get(&v.exp.fingerprint());
    let describe =
        |exp: &Experiment| format!("{} {}", exp.algorithm.kind.paper_name(), exp.algorithm.clip);
    let mut out = Vec::new();
    for (k, values) in sweep.spec.points().into_iter().enumerate() {
        let runs: Vec<&Variant> = sweep
            .variants
            .iter()
            .filter(|v| v.point == Some(k))
            .collect();
        let first = &runs[0].exp;
        let mut baseline = None;
        let (mut best, mut b_best, mut d_best, mut d_final) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut b_final, mut clip, mut b_clip) = (Vec::new(), Vec::new(), Vec::new());
        for v in runs {
            let pair = sweep.variants.iter().find(|w| {
                w.point.is_none() && w.baseline == v.baseline && w.exp.seed == v.exp.seed
            });
            if let Some(w) = pair {
                baseline = Some(format!(
                    "{} ({})",
                    w.exp.algorithm.kind.paper_name(),
                    w.exp.name
                ));
            }
            let Some(run) = load(v) else { continue };
            best.push(100.0 * run.best);
            clip.extend(run.own_clip.map(|c| 100.0 * c));
            if let Some(paired) = pair.and_then(load) {
                b_best.push(100.0 * paired.best);
                b_final.push(100.0 * paired.last);
                b_clip.extend(paired.own_clip.map(|c| 100.0 * c));
                d_best.push(100.0 * (run.best - paired.best));
                d_final.push(100.0 * (run.last - paired.last));
            }
        }
        out.push(PointResult {
            values,
            rule: describe(first),
            kind: first.algorithm.kind,
            clip: first.algorithm.clip,
            updates_per_step: first.actor.updates_per_step(first.trainer.batch_size),
            baseline,
            seeds: best.len(),
            best: Interval::of(&best),
            baseline_best: Interval::of(&b_best),
            baseline_final: Interval::of(&b_final),
            own_clip: Interval::of(&clip),
            baseline_clip: Interval::of(&b_clip),
            delta_best: Interval::of(&d_best),
            delta_final: Interval::of(&d_final),
        });
    }
    out
}
