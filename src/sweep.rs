//! `acpo sweep SPEC.yaml...` (issue #23): a grid over manifest fields × seeds from one base
//! manifest, each grid point paired seed by seed with a baseline, trained side by side and
//! resumable like `reproduce` ([`crate::reproduce::train_runs`]), and a report of the paired
//! difference to the baseline per grid point, as a table and a figure. Several specs train
//! together (a baseline run they share, once) and can be compared in one table and figure:
//! per baseline, each rule's difference by the off-policy degree ([`Compare`]).
//!
//! A spec:
//!
//! ```yaml
//! name: alpha-offpolicy            # the sweep's directory: <results>/sweeps/<name>/
//! base: experiments/mini/mini-xs-grpo-ac.yaml
//! baseline: experiments/mini/mini-xs-grpo.yaml   # optional
//! seeds: 3                         # the base's seed s, s + 1, s + 2
//! grid:                            # dotted manifest fields and their values; the product
//!   algorithm.alpha: [0.5, 1, 2, 1.0e9]  # YAML's .inf is refused, as in manifests
//!   actor.mini_batch_size: [16, 4, 1]
//! ```
//!
//! A grid point's manifest is the base's text with each field's value replaced (or added under
//! its parent, which must exist), so comments and layout stay; it is then validated like any
//! manifest, so a field the manifest format does not have is refused with its name. The
//! baseline takes a point's values of the fields its own manifest has (the off-policy degree,
//! say) and keeps its own elsewhere (it has no α); grid points that give it the same values
//! share its runs, which live in `<results>/sweeps/baselines/` for every sweep to reuse. Paths in
//! the spec are relative to the working directory, like a manifest's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::manifest::{Experiment, ManifestError};
use crate::report::seeds::Interval;
use crate::report::ReportError;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{}: field `{field}`: {reason}", path.display())]
    Spec {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("{}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("{}: {count} of the sweeps' runs are not there (the first: {first})", path.display())]
    Missing {
        path: PathBuf,
        count: usize,
        first: String,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Reproduce(#[from] crate::reproduce::ReproduceError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, SweepError>;

/// The most runs one spec may plan (its grid points × seeds): the study's largest sweep plans
/// 54, and beyond this planning alone takes minutes and gigabytes.
pub const MAX_RUNS: usize = 4096;

/// A sweep as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    pub base: PathBuf,
    #[serde(default)]
    pub baseline: Option<PathBuf>,
    pub seeds: usize,
    pub grid: BTreeMap<String, Vec<GridValue>>,
}

/// One value of a grid field, written back into a manifest as YAML.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum GridValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
}

impl GridValue {
    /// The value as YAML text. (The YAML reader refuses `.inf`, as manifests do: an
    /// unclipped α is a large one, or the baseline's `policy_loss: unclipped`.)
    pub fn yaml(&self) -> String {
        match self {
            GridValue::Bool(b) => b.to_string(),
            GridValue::Int(i) => i.to_string(),
            // 1e9 and 5e-4 as written, not 1000000000.0 and 0.0005, but 2.0, not 2 (all YAML
            // floats)
            GridValue::Float(x) => match crate::manifest::short(*x) {
                e if e.contains('e') => e,
                _ => format!("{x:?}"),
            },
            // One YAML scalar whatever the text holds (issue #35: a value never adds fields):
            // plain when it is a word YAML reads as a string, else double-quoted.
            GridValue::Text(s) if plain_word(s) => s.clone(),
            GridValue::Text(s) => serde_json::to_string(s).expect("invariant: a string is JSON"),
        }
    }

    /// The value in a Markdown table cell: its YAML, with `|` and line breaks escaped.
    fn cell(&self) -> String {
        self.yaml().replace('|', "\\|").replace('\n', " ")
    }

    /// A number for the figure's x axis.
    fn number(&self) -> Option<f64> {
        match self {
            GridValue::Int(i) => Some(*i as f64),
            GridValue::Float(x) => Some(*x),
            _ => None,
        }
    }
}

impl Spec {
    /// Reads and checks a spec: one clear error naming the field for anything wrong.
    pub fn load(path: &Path) -> Result<Spec> {
        let text = std::fs::read_to_string(path).map_err(|source| SweepError::Io {
            path: path.to_owned(),
            source,
        })?;
        let spec: Spec = serde_saphyr::from_str(&text).map_err(|e| SweepError::Parse {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let fail = |field: &str, reason: &str| {
            Err(SweepError::Spec {
                path: path.to_owned(),
                field: field.into(),
                reason: reason.into(),
            })
        };
        if !valid_name(&spec.name) {
            return fail("name", "letters, digits, '-' and '_' only, not empty");
        }
        if spec.name == BASELINES {
            return fail("name", "`baselines` holds every sweep's baseline runs");
        }
        if spec.seeds == 0 {
            return fail("seeds", "at least 1");
        }
        if spec.grid.is_empty() {
            return fail("grid", "no field to vary");
        }
        // The runs the spec plans, counted before any is made (issue #35).
        let runs = spec
            .grid
            .values()
            .try_fold(spec.seeds, |n, values| n.checked_mul(values.len()))
            .filter(|&n| n <= MAX_RUNS);
        if runs.is_none() {
            return fail(
                "grid",
                &format!("grid points × seeds come to more than {MAX_RUNS} runs"),
            );
        }
        for (field, values) in &spec.grid {
            if values.is_empty() {
                return fail(&format!("grid.{field}"), "no values");
            }
            if field == "seed" || field == "name" {
                return fail(
                    &format!("grid.{field}"),
                    "set by the sweep itself (seeds, name)",
                );
            }
        }
        Ok(spec)
    }

    /// The grid points, in the spec's field order (sorted by name), the last field fastest.
    pub fn points(&self) -> Vec<Vec<(String, GridValue)>> {
        let mut points: Vec<Vec<(String, GridValue)>> = vec![Vec::new()];
        for (field, values) in &self.grid {
            points = points
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |v| {
                        let mut q = p.clone();
                        q.push((field.clone(), v.clone()));
                        q
                    })
                })
                .collect();
        }
        points
    }
}

/// Sets `path` (dotted) to `value` in a block-style YAML manifest: the line of the field if it
/// is there (its trailing comment dropped), else a new line under its parent. None when the
/// parent mapping is not in the text.
pub fn set_field(text: &str, path: &str, value: &str) -> Option<String> {
    let keys: Vec<&str> = path.split('.').collect();
    let (parent, leaf) = keys.split_at(keys.len() - 1);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // The mappings enclosing the current line: (indent, key).
    let mut stack: Vec<(usize, String)> = Vec::new();
    // Where a new child of the parent goes: after this line, at this indent.
    let mut insert: Option<(usize, usize)> = parent.is_empty().then_some((lines.len(), 0));
    // The parent's indent while the lines are inside its block.
    let mut in_parent: Option<usize> = None;
    for i in 0..lines.len() {
        let line = &lines[i];
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let indent = line.len() - body.len();
        if let Some(p) = in_parent {
            if indent > p {
                insert = insert.map(|(_, child)| (i + 1, child));
            } else {
                in_parent = None;
            }
        }
        let Some((key, _)) = body.split_once(':').filter(|_| !body.starts_with('-')) else {
            continue;
        };
        while stack.last().is_some_and(|(d, _)| *d >= indent) {
            stack.pop();
        }
        let here: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
        if here == keys {
            lines[i] = format!("{}{key}: {value}", " ".repeat(indent));
            return Some(join(&lines, text));
        }
        if !parent.is_empty() && here == parent {
            in_parent = Some(indent);
            insert = Some((i + 1, indent + 2));
        }
        stack.push((indent, key.to_string()));
    }
    let (at, indent) = insert?;
    lines.insert(at, format!("{}{}: {value}", " ".repeat(indent), leaf[0]));
    Some(join(&lines, text))
}

fn join(lines: &[String], original: &str) -> String {
    let mut out = lines.join("\n");
    if original.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Whether the manifest text has the dotted field itself.
fn has_field(text: &str, path: &str) -> bool {
    // Setting it to a marker changes an existing line in place: same line count.
    set_field(text, path, "0").is_some_and(|t| t.lines().count() == text.lines().count())
}

/// The directory under `<results>/sweeps/` that every sweep's baseline runs share: sweeps
/// with one baseline manifest (the study's ACPO, CISPO and GSPO sweeps of a family) train each
/// of its runs once.
pub const BASELINES: &str = "baselines";

/// The fields that set the off-policy degree, the policy updates per training step
/// ([`crate::manifest::ActorSpec::updates_per_step`]): a comparison's columns.
const DEGREE_FIELDS: [&str; 3] = [
    "actor.mini_batch_size",
    "actor.epochs",
    "trainer.batch_size",
];

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
}

/// One run of the sweep: a grid point's (or the baseline's) manifest at one seed.
#[derive(Debug, Clone)]
pub struct Variant {
    /// The grid point, or None for a baseline run.
    pub point: Option<usize>,
    /// The baseline's variant this run is paired with (its index among the baseline manifests).
    pub baseline: Option<usize>,
    pub exp: Experiment,
    pub text: String,
}

/// A spec and its plan.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub spec: Spec,
    pub path: PathBuf,
    pub variants: Vec<Variant>,
}

impl Sweep {
    pub fn load(path: &Path) -> Result<Sweep> {
        let spec = Spec::load(path)?;
        let variants = plan(&spec, path)?;
        Ok(Sweep {
            spec,
            path: path.to_owned(),
            variants,
        })
    }

    /// The results root of a run under `sweeps` (`<results>/sweeps/`): the sweep's own
    /// directory for a grid point's run, the shared [`BASELINES`] for a baseline's.
    pub fn home(&self, v: &Variant, sweeps: &Path) -> PathBuf {
        match v.point {
            Some(_) => sweeps.join(&self.spec.name),
            None => sweeps.join(BASELINES),
        }
    }
}

/// Loads and plans several specs; two of one name would share a directory and are refused.
pub fn load_all(paths: &[PathBuf]) -> Result<Vec<Sweep>> {
    let mut out: Vec<Sweep> = Vec::new();
    for path in paths {
        let sweep = Sweep::load(path)?;
        if let Some(other) = out.iter().find(|o| o.spec.name == sweep.spec.name) {
            return Err(SweepError::Spec {
                path: path.clone(),
                field: "name".into(),
                reason: format!(
                    "`{}` is {}'s name too",
                    sweep.spec.name,
                    other.path.display()
                ),
            });
        }
        out.push(sweep);
    }
    Ok(out)
}

/// Every run of the sweep, grid points first: their manifests are validated, so a field the
/// format does not know is refused here, naming it. A grid point's runs are named
/// `<sweep>-p<k>`; a baseline's keep the baseline manifest's name, so that sweeps sharing it
/// share its runs (their fingerprints tell its variants apart).
pub fn plan(spec: &Spec, spec_path: &Path) -> Result<Vec<Variant>> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|source| SweepError::Io {
            path: p.to_owned(),
            source,
        })
    };
    let base = read(&spec.base)?;
    let baseline = spec.baseline.as_deref().map(read).transpose()?;
    let mut out = Vec::new();
    let mut baselines: Vec<String> = Vec::new();
    for (k, point) in spec.points().into_iter().enumerate() {
        let mut text = base.clone();
        for (field, value) in &point {
            text = set_field(&text, field, &value.yaml()).ok_or_else(|| SweepError::Spec {
                path: spec_path.to_owned(),
                field: format!("grid.{field}"),
                reason: format!(
                    "{} has no `{}` to put it in",
                    spec.base.display(),
                    parent(field)
                ),
            })?;
        }
        let paired = match &baseline {
            None => None,
            Some(b) => {
                let mut t = b.clone();
                for (field, value) in &point {
                    if has_field(b, field) {
                        t = set_field(&t, field, &value.yaml()).expect("invariant: it has it");
                    }
                }
                Some(match baselines.iter().position(|x| *x == t) {
                    Some(i) => i,
                    None => {
                        baselines.push(t);
                        baselines.len() - 1
                    }
                })
            }
        };
        let name = format!("{}-p{k}", spec.name);
        out.extend(seeded(
            &text,
            Some(&name),
            spec,
            spec_path,
            Some(k),
            paired,
        )?);
    }
    for (i, t) in baselines.iter().enumerate() {
        out.extend(seeded(t, None, spec, spec_path, None, Some(i))?);
    }
    Ok(out)
}

/// Whether `s` is a word YAML reads back as this string: a letter, then letters, digits, `-`
/// and `_`, and not one of YAML's booleans or null.
fn plain_word(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !["true", "false", "null", "yes", "no", "on", "off", "y", "n"]
            .contains(&s.to_ascii_lowercase().as_str())
}

fn parent(field: &str) -> &str {
    field.rsplit_once('.').map_or(field, |(p, _)| p)
}

/// `text` (renamed to `name`, if given) at the spec's seeds, validated.
fn seeded(
    text: &str,
    name: Option<&str>,
    spec: &Spec,
    spec_path: &Path,
    point: Option<usize>,
    baseline: Option<usize>,
) -> Result<Vec<Variant>> {
    // Errors name the manifest the text came from (the base, or the baseline), a file that is
    // there, not the grid point's name.
    let (named, path) = match name {
        Some(name) => (
            set_field(text, "name", name).ok_or_else(|| SweepError::Spec {
                path: spec_path.to_owned(),
                field: "base".into(),
                reason: "the manifest has no top-level `name`".into(),
            })?,
            spec.base.clone(),
        ),
        None => (
            text.to_string(),
            spec.baseline.clone().unwrap_or_else(|| spec.base.clone()),
        ),
    };
    let first = Experiment::from_yaml(&named, &path).map_err(|e| {
        // A field the grid put in is reported as the spec's.
        let field = e.field().map(str::to_owned);
        match field.filter(|f| spec.grid.keys().any(|g| f.starts_with(g.as_str()))) {
            Some(field) => SweepError::Spec {
                path: spec_path.to_owned(),
                field: format!("grid.{field}"),
                reason: match e {
                    ManifestError::Invalid { reason, .. } => reason,
                    ManifestError::Parse { message, .. } => message,
                    other => other.to_string(),
                },
            },
            None => SweepError::Manifest(e),
        }
    })?;
    Ok(first
        .seeds(&named, spec.seeds, &path)?
        .into_iter()
        .map(|(exp, text)| Variant {
            point,
            baseline,
            exp,
            text,
        })
        .collect())
}

/// What a sweep's report reads of a finished run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Best and final (last evaluation's) weighted accuracy, as fractions.
    pub best: f64,
    pub last: f64,
    /// The share of update tokens its own clip acted on, averaged over its steps
    /// ([`crate::run::metric::own_clip`]).
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
                let key = crate::run::metric::own_clip(r.algorithm);
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

/// Where the runs of [`run`] come from.
pub enum Source<'a> {
    /// Train what is not finished under `<results>/sweeps/` (side by side, resumed).
    Train {
        data: &'a crate::data::DataLocation,
        jobs: Option<usize>,
    },
    /// Report from a directory of finished run directories (an unpacked archive) without
    /// training; every planned run must be there.
    Finished(&'a Path),
}

/// A comparison across the sweeps of one call (`--compare NAME`): per baseline, each rule's
/// paired difference by policy updates per step, as `<reports>/NAME.md` and
/// `<figures>/NAME.{png,svg}`.
pub struct Compare<'a> {
    pub name: &'a str,
    pub figures: &'a Path,
}

/// Trains (or finds) every run of `sweeps` and writes each sweep's `sweep.md` and figure under
/// `<reports>/<name>/`, and the comparison if asked. Returns the reports' root (`<results>/
/// sweeps/`, or `<runs>/sweeps/` for [`Source::Finished`]: the block root of `--doc`) and the
/// files written.
pub fn run(
    sweeps: &[Sweep],
    source: Source,
    results: &Path,
    compare: Option<Compare>,
) -> Result<(PathBuf, Vec<PathBuf>)> {
    if let Some(c) = &compare {
        if !valid_name(c.name) {
            return Err(SweepError::Spec {
                path: PathBuf::from("--compare"),
                field: c.name.into(),
                reason: "letters, digits, '-' and '_' only, not empty".into(),
            });
        }
    }
    let (reports, finished) = match source {
        Source::Train { data, jobs } => {
            let root = results.join("sweeps");
            let mut jobs_list: Vec<crate::reproduce::Job> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for s in sweeps {
                for v in &s.variants {
                    let home = s.home(v, &root);
                    if seen.insert(crate::run::RunDir::of(&v.exp, &home).path().to_owned()) {
                        jobs_list.push(crate::reproduce::Job {
                            exp: v.exp.clone(),
                            text: v.text.clone(),
                            results: home,
                        });
                    }
                }
            }
            crate::reproduce::train_runs(jobs_list, data, jobs)?;
            let finished = finished(&trained_dirs(sweeps, &root))?;
            (root, finished)
        }
        Source::Finished(runs) => {
            let finished = finished(&[runs.to_owned()])?;
            let missing: Vec<String> = sweeps
                .iter()
                .flat_map(|s| &s.variants)
                .filter(|v| !finished.contains_key(&v.exp.fingerprint()))
                .map(|v| crate::run::RunDir::name_of(&v.exp))
                .collect();
            if let Some(first) = missing.first() {
                return Err(SweepError::Missing {
                    path: runs.to_owned(),
                    count: missing.len(),
                    first: first.clone(),
                });
            }
            (runs.join("sweeps"), finished)
        }
    };
    let mut written = Vec::new();
    let mut all = Vec::new();
    for s in sweeps {
        let points = point_results(s, &finished);
        let dir = reports.join(&s.spec.name);
        written.push(put(&dir, "sweep.md", &markdown(&s.spec, &points))?);
        written.extend(figure(&s.spec, &points, &dir.join("sweep"))?);
        all.push((s, points));
    }
    if let Some(c) = compare {
        let panels = comparison(&all)?;
        let (seeds, names): (Vec<usize>, Vec<&str>) = all
            .iter()
            .map(|(s, _)| (s.spec.seeds, s.spec.name.as_str()))
            .unzip();
        written.push(put(
            &reports,
            &format!("{}.md", c.name),
            &comparison_markdown(&panels, &names, &seeds),
        )?);
        written.extend(comparison_figure(&panels, c.name, &c.figures.join(c.name))?);
    }
    Ok((reports, written))
}

/// Writes `dir/name` atomically, creating `dir`.
fn put(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    crate::atomic::write_in(dir, name, text.as_bytes()).map_err(|source| SweepError::Io {
        path: dir.join(name),
        source,
    })
}

fn plain(i: &Option<Interval>) -> String {
    i.as_ref().map_or("—".into(), |i| i.show_unsigned(1))
}

/// A share in % of tokens, with two decimals (a clip often acts on a few tokens in ten
/// thousand).
fn share(i: &Option<Interval>) -> String {
    i.as_ref()
        .map_or("—".into(), |i| format!("{:.2} %", i.mean))
}

fn signed(i: &Option<Interval>) -> String {
    i.as_ref().map_or("—".into(), |i| i.show(1))
}

/// The table as Markdown.
pub fn markdown(spec: &Spec, points: &[PointResult]) -> String {
    let fields: Vec<&String> = spec.grid.keys().collect();
    let mut s = String::from("| ");
    for f in &fields {
        s.push_str(&format!("{f} | "));
    }
    s.push_str("seeds | best [95 % CI] | baseline best | Δ best vs baseline [95 % CI] | Δ final vs baseline [95 % CI] | own clip active | baseline's clip active |\n|");
    s.push_str(&"---|".repeat(fields.len()));
    s.push_str("---:|---:|---:|---:|---:|---:|---:|\n");
    for p in points {
        s.push_str("| ");
        for (_, v) in &p.values {
            s.push_str(&format!("{} | ", v.cell()));
        }
        s.push_str(&format!(
            "{} | {} | {} | {} | {} | {} | {} |\n",
            p.seeds,
            plain(&p.best),
            plain(&p.baseline_best),
            signed(&p.delta_best),
            signed(&p.delta_final),
            share(&p.own_clip),
            share(&p.baseline_clip)
        ));
    }
    let against = points
        .iter()
        .find_map(|p| p.baseline.as_deref())
        .map_or(String::new(), |b| format!(" The baseline is {b}."));
    s.push_str(&format!("\nWeighted accuracy in points. Δ = grid point − baseline, paired by seed; intervals are Student's t over seeds. Clip active: the share of update tokens the run's own clip acted on, the mean over its steps, then its seeds.{against}\n"));
    s
}

/// A comparison's panel: one baseline, its rules (rows) by updates per step (columns).
struct ComparisonPanel<'a> {
    baseline: String,
    columns: Vec<usize>,
    rows: Vec<(String, BTreeMap<usize, &'a PointResult>)>,
}

/// The sweeps' points grouped by baseline; a row is a rule with the grid values that are
/// neither the algorithm's (in the rule) nor the off-policy degree's (the columns).
fn comparison<'a>(all: &'a [(&Sweep, Vec<PointResult>)]) -> Result<Vec<ComparisonPanel<'a>>> {
    let mut panels: Vec<ComparisonPanel> = Vec::new();
    for (sweep, points) in all {
        for p in points {
            let Some(baseline) = &p.baseline else {
                continue;
            };
            let mut row = p.rule.clone();
            for (f, v) in &p.values {
                if !f.starts_with("algorithm.") && !DEGREE_FIELDS.contains(&f.as_str()) {
                    row.push_str(&format!(", {f}={}", v.cell()));
                }
            }
            let panel = match panels.iter().position(|q| q.baseline == *baseline) {
                Some(i) => &mut panels[i],
                None => {
                    panels.push(ComparisonPanel {
                        baseline: baseline.clone(),
                        columns: Vec::new(),
                        rows: Vec::new(),
                    });
                    panels.last_mut().expect("just pushed")
                }
            };
            if !panel.columns.contains(&p.updates_per_step) {
                panel.columns.push(p.updates_per_step);
                panel.columns.sort_unstable();
            }
            let cells = match panel.rows.iter().position(|(r, _)| *r == row) {
                Some(i) => &mut panel.rows[i].1,
                None => {
                    panel.rows.push((row.clone(), BTreeMap::new()));
                    &mut panel.rows.last_mut().expect("just pushed").1
                }
            };
            if cells.insert(p.updates_per_step, p).is_some() {
                return Err(SweepError::Spec {
                    path: sweep.path.clone(),
                    field: "grid".into(),
                    reason: format!(
                        "two grid points are `{row}` at {} updates per step: a comparison needs one",
                        p.updates_per_step
                    ),
                });
            }
        }
    }
    Ok(panels)
}

fn updates(u: usize) -> String {
    if u == 1 {
        "1 update / step".into()
    } else {
        format!("{u} updates / step")
    }
}

/// A cell of a comparison's table, from one grid point.
type Cell<'a> = &'a dyn Fn(&PointResult) -> String;

/// One table of a panel: a first row of the baseline's own numbers (taken from any rule's
/// point at that degree: they share its runs), then a row per rule.
fn comparison_table(s: &mut String, panel: &ComparisonPanel, first: (&str, Cell), cell: Cell) {
    s.push_str("| |");
    for &u in &panel.columns {
        s.push_str(&format!(" {} |", updates(u)));
    }
    s.push_str("\n|---|");
    s.push_str(&"---:|".repeat(panel.columns.len()));
    s.push('\n');
    let (label, of_baseline) = first;
    s.push_str(&format!("| {label} |"));
    for u in &panel.columns {
        let b = panel.rows.iter().find_map(|(_, c)| c.get(u));
        s.push_str(&format!(" {} |", b.map_or("—".into(), |p| of_baseline(p))));
    }
    s.push('\n');
    for (row, cells) in &panel.rows {
        s.push_str(&format!("| {row} |"));
        for u in &panel.columns {
            s.push_str(&format!(
                " {} |",
                cells.get(u).map_or("—".into(), |p| cell(p))
            ));
        }
        s.push('\n');
    }
}

fn comparison_markdown(panels: &[ComparisonPanel], names: &[&str], seeds: &[usize]) -> String {
    let mut s = String::new();
    for panel in panels {
        let b = &panel.baseline;
        s.push_str(&format!("#### Against {b}\n\nΔ best weighted accuracy (the rule's best evaluation − the baseline's, paired by seed):\n\n"));
        let best = format!("{b}: its own best");
        comparison_table(&mut s, panel, (&best, &|p| plain(&p.baseline_best)), &|p| {
            signed(&p.delta_best)
        });
        s.push_str("\nΔ final weighted accuracy (the last evaluation − the baseline's):\n\n");
        let last = format!("{b}: its own final");
        comparison_table(
            &mut s,
            panel,
            (&last, &|p| plain(&p.baseline_final)),
            &|p| signed(&p.delta_final),
        );
        s.push_str("\nHow often each rule's own clip acted (% of update tokens, the mean over steps, then seeds):\n\n");
        let clip = format!("{b}: its ratio clip");
        comparison_table(&mut s, panel, (&clip, &|p| share(&p.baseline_clip)), &|p| {
            share(&p.own_clip)
        });
        s.push('\n');
    }
    let mut seeds: Vec<usize> = seeds.to_vec();
    seeds.sort_unstable();
    seeds.dedup();
    let seeds = seeds
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(" or ");
    s.push_str(&format!("Points of weighted accuracy, mean [95 % CI], Student's t over {seeds} seeds; from the sweeps {}.\n", names.join(", ")));
    s
}

/// The comparison's figure: per baseline, Δ best and Δ final against the policy updates per
/// step (log2), one line per rule with its 95 % intervals as error bars (the rules side by side
/// at each degree; the legend once per baseline, right of the Δ final panel's data).
fn comparison_figure(panels: &[ComparisonPanel], title: &str, stem: &Path) -> Result<Vec<PathBuf>> {
    type Of = fn(&PointResult) -> &Option<Interval>;
    let measures: [(&str, Of, bool); 2] = [
        ("best", |p| &p.delta_best, false),
        ("final", |p| &p.delta_final, true),
    ];
    let mut drawn = Vec::new();
    for panel in panels {
        let n = panel.rows.len();
        let right = panel
            .columns
            .iter()
            .map(|&u| (u as f64).log2())
            .fold(0.0, f64::max);
        for (name, of, legend) in measures {
            let series = panel
                .rows
                .iter()
                .enumerate()
                .map(|(i, (row, cells))| {
                    // side by side: the rules spread over ±0.2 around each degree
                    let dodge = if n > 1 {
                        0.4 * (i as f64 / (n - 1) as f64 - 0.5)
                    } else {
                        0.0
                    };
                    let at: Vec<(f64, &Interval)> = cells
                        .iter()
                        .filter_map(|(&u, p)| {
                            of(p).as_ref().map(|d| ((u as f64).log2() + dodge, d))
                        })
                        .collect();
                    crate::plot::Series {
                        label: if legend { row.clone() } else { String::new() },
                        color: PALETTE[i % PALETTE.len()],
                        points: at.iter().map(|(x, d)| (*x, d.mean)).collect(),
                        band: at.iter().map(|(x, d)| d.band_at(*x)).collect(),
                    }
                })
                .collect();
            drawn.push(crate::plot::Panel {
                title: format!("Δ {name} against {}", panel.baseline),
                x_desc: "log2 policy updates per step".into(),
                y_desc: format!("Δ {name}, points (95 % CI)"),
                series,
                // room on the right for the legend, off the bars
                x_range: Some((-0.5, right + 5.5)),
                legend: crate::plot::Legend::UpperRight,
                error_bars: true,
                ..crate::plot::Panel::default()
            });
        }
    }
    Ok(crate::plot::write_figure(stem, title, &drawn, 2).map_err(ReportError::from)?)
}

const PALETTE: [plotters::style::RGBColor; 8] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(140, 86, 75),
    plotters::style::RGBColor(227, 119, 194),
    plotters::style::RGBColor(127, 127, 127),
];

/// The figure: Δ best against the first grid field (on log10 where it spans orders of
/// magnitude), one line per value of the other fields, with its 95 % band.
pub fn figure(spec: &Spec, points: &[PointResult], stem: &Path) -> Result<Vec<PathBuf>> {
    use crate::plot::{write_figure, Panel, Series};
    let Some(x_field) = spec.grid.keys().next() else {
        return Ok(Vec::new());
    };
    // A field spanning orders of magnitude (α up to 1e9, "no clip") is drawn on log10.
    let xs: Vec<f64> = points
        .iter()
        .filter_map(|p| p.values[0].1.number())
        .collect();
    let (lo, hi) = xs
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
    let log_x = lo > 0.0 && hi / lo >= 100.0;
    let x_of = |v: &GridValue| v.number().map(|x| if log_x { x.log10() } else { x });
    // One line per combination of the other fields, in the spec's order of their values.
    let mut lines: Vec<(String, Vec<&PointResult>)> = Vec::new();
    for p in points {
        let label = p.values[1..]
            .iter()
            .map(|(f, v)| format!("{f} = {}", v.yaml()))
            .collect::<Vec<_>>()
            .join(", ");
        match lines.iter_mut().find(|(l, _)| *l == label) {
            Some((_, ps)) => ps.push(p),
            None => lines.push((label, vec![p])),
        }
    }
    let series = lines
        .into_iter()
        .enumerate()
        .map(|(i, (label, ps))| {
            let mut points = Vec::new();
            let mut band = Vec::new();
            for p in ps {
                if let (Some(x), Some(d)) = (x_of(&p.values[0].1), &p.delta_best) {
                    points.push((x, d.mean));
                    band.push(d.band_at(x));
                }
            }
            Series {
                label: if label.is_empty() {
                    "Δ best".into()
                } else {
                    label
                },
                color: PALETTE[i % PALETTE.len()],
                points,
                band,
            }
        })
        .collect();
    let panel = Panel {
        title: format!("{}: Δ best weighted accuracy vs the baseline", spec.name),
        x_desc: if log_x {
            format!("log10 {x_field}")
        } else {
            x_field.clone()
        },
        y_desc: "Δ points (95 % CI)".into(),
        series,
        marks: vec![],
        ..Panel::default()
    };
    Ok(write_figure(stem, &spec.name, &[panel], 1).map_err(ReportError::from)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "name: x\nseed: 1\nalgorithm:\n  name: grpo\n  clip_ratio_low: 0.2   # a comment\nactor:\n  optim:\n    lr: 1.0e-3\n  mini_batch_size: 2\ntrainer:\n  total_steps: 3\n";

    #[test]
    fn set_field_replaces_nested_keys_adds_missing_leaves_and_refuses_missing_parents() {
        let t = set_field(YAML, "actor.optim.lr", "5e-4").expect("there");
        assert!(t.contains("\n    lr: 5e-4\n") && !t.contains("1.0e-3"));
        assert_eq!(t.lines().count(), YAML.lines().count());
        let t = set_field(YAML, "algorithm.clip_ratio_low", "0.1").expect("there");
        assert!(
            t.contains("\n  clip_ratio_low: 0.1\n"),
            "comment dropped: {t}"
        );
        // a missing leaf goes at the end of its parent's block, at the children's indent
        let t = set_field(YAML, "actor.epochs", "4").expect("parent there");
        assert!(
            t.contains("  mini_batch_size: 2\n  epochs: 4\ntrainer:"),
            "{t}"
        );
        let t = set_field(YAML, "algorithm.alpha", "2").expect("parent there");
        assert!(
            t.contains("  clip_ratio_low: 0.2   # a comment\n  alpha: 2\nactor:"),
            "{t}"
        );
        assert_eq!(set_field(YAML, "critic.optim.lr", "1"), None);
        assert!(set_field(YAML, "name", "y")
            .expect("top")
            .starts_with("name: y\n"));
        assert!(has_field(YAML, "actor.mini_batch_size"));
        assert!(!has_field(YAML, "algorithm.alpha"));
    }

    #[test]
    fn grid_values_are_written_back_as_yaml() {
        assert_eq!(GridValue::Float(1e9).yaml(), "1e9");
        assert_eq!(GridValue::Float(5e-4).yaml(), "5e-4");
        assert_eq!(GridValue::Float(0.5).yaml(), "0.5");
        assert_eq!(GridValue::Int(16).yaml(), "16");
        assert_eq!(GridValue::Text("cispo".into()).yaml(), "cispo");
        // anything else is one quoted scalar: it cannot add fields or turn into a number
        assert_eq!(
            GridValue::Text("x\nalgorithm:\n  alpha: 9".into()).yaml(),
            r#""x\nalgorithm:\n  alpha: 9""#
        );
        assert_eq!(GridValue::Text("true".into()).yaml(), r#""true""#);
        assert_eq!(GridValue::Text("1e3".into()).yaml(), r#""1e3""#);
        assert_eq!(GridValue::Text("a | b".into()).cell(), r#""a \| b""#);
    }
}
