//! `acpo sweep SPEC.yaml` (issue #23): a grid over manifest fields × seeds from one base
//! manifest, each grid point paired seed by seed with a baseline, trained side by side and
//! resumable like `reproduce` ([`crate::reproduce::train_runs`]), and a report of the paired
//! difference to the baseline per grid point, as a table and a figure.
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
//! share its runs. Paths in the spec are relative to the working directory, like a manifest's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::manifest::{Experiment, ManifestError};
use crate::report::seeds::Interval;
use crate::report::{ReportError, RunResult};

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
            // 1e9 and 5e-4 as written, not 1000000000.0 and 0.0005 (both YAML floats)
            GridValue::Float(x) if *x != 0.0 && !(1e-3..1e5).contains(&x.abs()) => {
                format!("{x:e}")
            }
            GridValue::Float(x) => format!("{x:?}"),
            GridValue::Text(s) => s.clone(),
        }
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
        let name_ok = !spec.name.is_empty()
            && spec
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
        if !name_ok {
            return fail("name", "letters, digits, '-' and '_' only, not empty");
        }
        if spec.seeds == 0 {
            return fail("seeds", "at least 1");
        }
        if spec.grid.is_empty() {
            return fail("grid", "no field to vary");
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

/// Every run of the sweep, grid points first: their manifests are validated, so a field the
/// format does not know is refused here, naming it.
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
        out.extend(seeded(&text, &name, spec, spec_path, Some(k), paired)?);
    }
    for (i, t) in baselines.iter().enumerate() {
        let name = format!("{}-baseline{i}", spec.name);
        out.extend(seeded(t, &name, spec, spec_path, None, Some(i))?);
    }
    Ok(out)
}

fn parent(field: &str) -> &str {
    field.rsplit_once('.').map_or(field, |(p, _)| p)
}

/// `text` renamed to `name` at the spec's seeds, validated.
fn seeded(
    text: &str,
    name: &str,
    spec: &Spec,
    spec_path: &Path,
    point: Option<usize>,
    baseline: Option<usize>,
) -> Result<Vec<Variant>> {
    let path = spec_path.with_file_name(format!("{name}.yaml"));
    let named = set_field(text, "name", name).ok_or_else(|| SweepError::Spec {
        path: spec_path.to_owned(),
        field: "base".into(),
        reason: "the manifest has no top-level `name`".into(),
    })?;
    let first = Experiment::from_yaml(&named, &path).map_err(|e| match e {
        // A field the grid put in is reported as the spec's.
        ManifestError::Invalid { field, reason, .. }
            if spec.grid.keys().any(|g| field.starts_with(g.as_str())) =>
        {
            SweepError::Spec {
                path: spec_path.to_owned(),
                field: format!("grid.{field}"),
                reason,
            }
        }
        e => SweepError::Manifest(e),
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

/// Best and final weighted accuracy of a finished run.
fn accuracies(r: &RunResult) -> Option<(f64, f64)> {
    let best = r.best()?.weighted_accuracy;
    let last = r.evals.iter().max_by_key(|e| e.step)?.weighted_accuracy;
    Some((best, last))
}

/// One grid point's results: its values, and per seed its and its baseline's accuracies.
#[derive(Debug, Clone)]
pub struct PointResult {
    pub values: Vec<(String, GridValue)>,
    /// (best, final) weighted accuracy of the point's runs, in points.
    pub best: Option<Interval>,
    /// Paired by seed: the point's minus its baseline's, in points.
    pub delta_best: Option<Interval>,
    pub delta_final: Option<Interval>,
    pub seeds: usize,
}

/// The sweep's table: per grid point, its best accuracy and the paired differences to the
/// baseline over seeds (Student's t, as `seeds.md`). `root` is the sweep's results root.
pub fn point_results(spec: &Spec, variants: &[Variant], root: &Path) -> Result<Vec<PointResult>> {
    let mut found: BTreeMap<PathBuf, (f64, f64)> = BTreeMap::new();
    let mut scales: Vec<PathBuf> = variants
        .iter()
        .filter_map(|v| {
            crate::run::RunDir::of(&v.exp, root)
                .path()
                .parent()
                .map(Path::to_owned)
        })
        .collect();
    scales.sort();
    scales.dedup();
    for scale in scales.iter().filter(|d| d.exists()) {
        for r in crate::report::load_results(scale)? {
            if let Some(acc) = accuracies(&r) {
                found.insert(r.dir.clone(), acc);
            }
        }
    }
    let load = |v: &Variant| {
        found
            .get(crate::run::RunDir::of(&v.exp, root).path())
            .copied()
    };
    let mut out = Vec::new();
    for (k, values) in spec.points().into_iter().enumerate() {
        let (mut best, mut d_best, mut d_final) = (Vec::new(), Vec::new(), Vec::new());
        for v in variants.iter().filter(|v| v.point == Some(k)) {
            let Some((b, f)) = load(v) else { continue };
            best.push(100.0 * b);
            let pair = variants.iter().find(|w| {
                w.point.is_none() && w.baseline == v.baseline && w.exp.seed == v.exp.seed
            });
            if let Some((pb, pf)) = pair.and_then(load) {
                d_best.push(100.0 * (b - pb));
                d_final.push(100.0 * (f - pf));
            }
        }
        out.push(PointResult {
            values,
            seeds: best.len(),
            best: Interval::of(&best),
            delta_best: Interval::of(&d_best),
            delta_final: Interval::of(&d_final),
        });
    }
    Ok(out)
}

/// Where a sweep's runs and report live: `<results>/sweeps/<name>/`.
pub fn root(spec: &Spec, results: &Path) -> PathBuf {
    results.join("sweeps").join(&spec.name)
}

/// Plans the sweep, trains what is missing (`reproduce`'s queue: side by side, finished runs
/// reused, interrupted ones resumed), and writes `sweep.md` and the figure in its root.
pub fn run(
    spec_path: &Path,
    results: &Path,
    data: &crate::data::DataLocation,
    jobs: Option<usize>,
) -> Result<(PathBuf, Vec<PathBuf>)> {
    let spec = Spec::load(spec_path)?;
    let variants = plan(&spec, spec_path)?;
    let root = root(&spec, results);
    let runs = variants
        .iter()
        .map(|v| (v.exp.clone(), v.text.clone()))
        .collect();
    crate::reproduce::train_runs(runs, &root, data, jobs)?;
    let points = point_results(&spec, &variants, &root)?;
    let table = root.join("sweep.md");
    std::fs::create_dir_all(&root)
        .and_then(|()| crate::atomic::write(&table, markdown(&spec, &points).as_bytes()))
        .map_err(|source| SweepError::Io {
            path: table.clone(),
            source,
        })?;
    let mut written = vec![table];
    written.extend(figure(&spec, &points, &root.join("sweep"))?);
    Ok((root, written))
}

/// The table as Markdown.
pub fn markdown(spec: &Spec, points: &[PointResult]) -> String {
    let fields: Vec<&String> = spec.grid.keys().collect();
    let mut s = String::from("| ");
    for f in &fields {
        s.push_str(&format!("{f} | "));
    }
    s.push_str("seeds | best [95 % CI] | Δ best vs baseline [95 % CI] | Δ final vs baseline [95 % CI] |\n|");
    s.push_str(&"---|".repeat(fields.len()));
    s.push_str("---:|---:|---:|---:|\n");
    let show = |i: &Option<Interval>| i.as_ref().map_or("—".into(), |i| i.show(1));
    let plain = |i: &Option<Interval>| match i {
        Some(Interval {
            mean,
            half_width: Some(h),
            ..
        }) => format!("{mean:.1} [{:.1}, {:.1}]", mean - h, mean + h),
        Some(i) => format!("{:.1}", i.mean),
        None => "—".into(),
    };
    for p in points {
        s.push_str("| ");
        for (_, v) in &p.values {
            s.push_str(&format!("{} | ", v.yaml()));
        }
        s.push_str(&format!(
            "{} | {} | {} | {} |\n",
            p.seeds,
            plain(&p.best),
            show(&p.delta_best),
            show(&p.delta_final)
        ));
    }
    s.push_str("\nWeighted accuracy in points. Δ = grid point − baseline, paired by seed; intervals are Student's t over seeds.\n");
    s
}

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
    let palette = [
        plotters::style::RGBColor(31, 119, 180),
        plotters::style::RGBColor(255, 127, 14),
        plotters::style::RGBColor(44, 160, 44),
        plotters::style::RGBColor(214, 39, 40),
        plotters::style::RGBColor(148, 103, 189),
        plotters::style::RGBColor(140, 86, 75),
        plotters::style::RGBColor(227, 119, 194),
        plotters::style::RGBColor(127, 127, 127),
    ];
    let series = lines
        .into_iter()
        .enumerate()
        .map(|(i, (label, ps))| {
            let mut points = Vec::new();
            let mut band = Vec::new();
            for p in ps {
                if let (Some(x), Some(d)) = (x_of(&p.values[0].1), &p.delta_best) {
                    points.push((x, d.mean));
                    let h = d.half_width.unwrap_or(0.0);
                    band.push((x, d.mean - h, d.mean + h));
                }
            }
            Series {
                label: if label.is_empty() {
                    "Δ best".into()
                } else {
                    label
                },
                color: palette[i % palette.len()],
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
    }
}
