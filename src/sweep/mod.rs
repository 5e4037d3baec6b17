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

use crate::files::{AtPath, PathIoError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::manifest::edit::{has_field, set_field};
use crate::manifest::{Experiment, ManifestError};
use crate::report::ReportError;

mod points;
mod render;

pub use points::{finished, point_results, trained_dirs, Finished, Outcome, PointResult};
use render::{comparison, comparison_figure, comparison_markdown, figure, markdown};

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
    #[error(transparent)]
    Runs(#[from] crate::run::complete::RunsError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Reproduce(#[from] crate::reproduce::ReproduceError),
    #[error(transparent)]
    Io(#[from] PathIoError),
}

pub type Result<T> = std::result::Result<T, SweepError>;

/// The most runs one spec may plan (its grid points × seeds): one bound with `reproduce`'s.
pub use crate::reproduce::MAX_RUNS;

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
            GridValue::Float(x) => match crate::algo::method::short(*x) {
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
        let text = crate::files::read_to_string(path).at(path)?;
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

/// The directory under `<results>/sweeps/` that every sweep's baseline runs share: sweeps
/// with one baseline manifest (the study's ACPO, CISPO and GSPO sweeps of a family) train each
/// of its runs once.
pub const BASELINES: &str = "baselines";

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
    let read = |p: &Path| crate::files::read_to_string(p).at(p);
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
            // Every planned run there and complete (issue #47: the rule `reproduce --from`
            // follows too); the folder's other runs (other sweeps') are left alone.
            let mut seen = std::collections::HashSet::new();
            let planned: Vec<&Experiment> = sweeps
                .iter()
                .flat_map(|s| &s.variants)
                .filter(|v| seen.insert(v.exp.fingerprint()))
                .map(|v| &v.exp)
                .collect();
            crate::run::complete::expect(&planned, runs, crate::run::complete::Others::Ignored)?;
            (runs.join("sweeps"), finished(&[runs.to_owned()])?)
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
    Ok(crate::atomic::write_in(dir, name, text.as_bytes())?)
}

#[cfg(test)]
mod tests {
    use super::*;

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
