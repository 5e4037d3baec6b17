//! The paper's artifacts from `results/` only (docs/ARCHITECTURE.md: the report never trains or evaluates).
//!
//! - Table 1: for each run the eval step with the best weighted accuracy and its per-benchmark
//!   Avg@k; rows grouped by model in the paper's order (PPO, PPO-AC, GRPO, GRPO-AC); in each
//!   matched pair the better value of every column in bold (both on a tie, as the paper does).
//!   Markdown, LaTeX (booktabs) and CSV; optionally beside the paper's reported values.
//! - Step speedup (Section 5.3): the first step at which the -AC run reaches the baseline's best
//!   weighted accuracy, against the baseline's own step; averaged per family (the paper reports
//!   6.25× over PPO and 1.7× over GRPO). Computed, never typed.

pub mod doc;
pub mod figures;
pub mod plot;
pub mod seeds;
pub mod stats;
pub mod table;
pub mod verdict;

/// The paper's reported Table 1 (`paper/table1.csv`; its source is in `paper/README.md`).
pub const PAPER_TABLE1: &str = include_str!("../../paper/table1.csv");

use crate::files::{AtPath, PathIoError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::algo::clip::PolicyClip;
use crate::algo::method::AlgorithmKind;
use crate::data::Benchmark;
use crate::eval::EvalSummary;
use crate::manifest::Experiment;
use crate::run::RunDir;
use table::{Align::Left, Align::Right, Table};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error(transparent)]
    Plot(#[from] crate::report::plot::PlotError),
}

type Result<T> = std::result::Result<T, ReportError>;

/// One run's results as the report reads them.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub dir: PathBuf,
    /// The fingerprint of the manifest the directory holds: what a run is matched by (a
    /// directory's name can be anything).
    pub fingerprint: String,
    pub model: String,
    pub algorithm: AlgorithmKind,
    /// The run's seed (`acpo reproduce --seeds`: several runs of one manifest).
    pub seed: u64,
    /// The run's clipping rule: its own clip metric, and ACPO's threshold α for the tails
    /// figure's ±α.
    pub clip: PolicyClip,
    pub evals: Vec<EvalSummary>,
}

impl RunResult {
    /// The evaluation with the best weighted accuracy (the earliest on ties).
    pub fn best(&self) -> Option<&EvalSummary> {
        self.evals
            .iter()
            .fold(None, |best: Option<&EvalSummary>, e| match best {
                Some(b) if b.weighted_accuracy >= e.weighted_accuracy => Some(b),
                _ => Some(e),
            })
    }

    /// The first evaluation, by step, with at least this weighted accuracy.
    pub fn first_reaching(&self, weighted_accuracy: f64) -> Option<&EvalSummary> {
        self.evals
            .iter()
            .filter(|e| e.weighted_accuracy >= weighted_accuracy)
            .min_by_key(|e| e.step)
    }
}

/// Every run directory under `root` (a `results/<scale>` directory) that has evaluations.
pub fn load_results(root: &Path) -> Result<Vec<RunResult>> {
    let mut out = Vec::new();
    let dirs = crate::files::subdirs(root)?;
    for dir in dirs {
        let run = RunDir::at(&dir);
        let (manifest, evals) = (run.manifest(), run.eval());
        if !manifest.exists() || !evals.exists() {
            continue;
        }
        let text = crate::files::read_to_string(&manifest).at(&manifest)?;
        let exp = Experiment::from_yaml(&text, &manifest)?;
        let mut summaries = Vec::new();
        for (i, line) in crate::files::read_to_string(&evals)
            .at(&evals)?
            .lines()
            .enumerate()
        {
            let s: EvalSummary = serde_json::from_str(line).map_err(|e| ReportError::Invalid {
                path: evals.clone(),
                reason: format!("line {}: {e}", i + 1),
            })?;
            // an accuracy is a fraction: anything else is a corrupt or foreign file
            let fractions = std::iter::once(("weighted_accuracy", s.weighted_accuracy)).chain(
                s.benchmarks
                    .iter()
                    .map(|b| (b.benchmark.as_str(), b.avg_at_k)),
            );
            for (what, x) in fractions {
                if !(0.0..=1.0).contains(&x) {
                    return Err(ReportError::Invalid {
                        path: evals.clone(),
                        reason: format!(
                            "line {}: the accuracy of {what} is {x}, not a fraction in [0, 1]",
                            i + 1
                        ),
                    });
                }
            }
            summaries.push(s);
        }
        out.push(RunResult {
            dir,
            fingerprint: exp.fingerprint(),
            model: exp.model.source.label(),
            algorithm: exp.algorithm.kind,
            seed: exp.seed,
            clip: exp.algorithm.clip,
            evals: summaries,
        });
    }
    Ok(out)
}

/// The metrics lines of a run (`metrics.jsonl`), empty if it has none yet.
pub fn load_metrics(dir: &Path) -> Result<Vec<BTreeMap<String, f64>>> {
    let path = RunDir::at(dir).metrics();
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = crate::files::read_to_string(&path).at(&path)?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| ReportError::Invalid {
                path: path.clone(),
                reason: format!("line {}: {e}", i + 1),
            })
        })
        .collect()
}

/// Models in the paper's order, others after, alphabetically.
fn model_order(models: impl Iterator<Item = String>) -> Vec<String> {
    // The paper's rows, then the mini scale's stand-ins smallest first.
    const PAPER: [&str; 8] = [
        "Qwen2.5-Math-7B",
        "Qwen3-1.7B",
        "Qwen3-4B",
        "Qwen3-8B",
        "qwen3-mini-xs",
        "qwen3-mini-s",
        "qwen3-mini-m",
        "qwen3-mini-l",
    ];
    let mut ms: Vec<String> = models
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    ms.sort_by_key(|m| {
        (
            PAPER.iter().position(|p| p == m).unwrap_or(PAPER.len()),
            m.clone(),
        )
    });
    ms
}

/// A benchmark column of Table 1: the name its evaluations are recorded under and its heading.
/// The table has one for each of [`Benchmark::ALL`] ([`table1`]); any list builds one
/// ([`table1_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The benchmark's name in `eval.jsonl` (`BenchResult::benchmark`).
    pub name: &'static str,
    /// Its heading in the Markdown and LaTeX tables; the CSV's column is it in snake case
    /// (`AIME-like` → `aime_like`).
    pub heading: &'static str,
}

impl Column {
    pub fn of(b: Benchmark) -> Column {
        Column {
            name: b.name(),
            heading: b.heading(),
        }
    }

    fn csv_key(&self) -> String {
        self.heading.to_lowercase().replace('-', "_")
    }
}

/// The weighted-accuracy column, first of every row.
const WEIGHTED: &str = "Weighted Acc.";
const WEIGHTED_CSV: &str = "weighted_acc";

/// Table 1: its benchmark columns and a group of rows per model.
#[derive(Debug, Clone, PartialEq)]
pub struct Table1 {
    pub columns: Vec<Column>,
    pub groups: Vec<Group>,
}

impl Table1 {
    /// Every value column's heading: the weighted accuracy, then each benchmark's.
    fn headings(&self) -> impl Iterator<Item = &'static str> + '_ {
        std::iter::once(WEIGHTED).chain(self.columns.iter().map(|c| c.heading))
    }
}

/// One row of Table 1 (values in percent): the weighted accuracy, then one value per column.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub method: AlgorithmKind,
    pub step: usize,
    /// weighted, then the table's columns in order (MATH500, Minerva, OlympiadBench, AIME-like)
    pub values: Vec<Option<f64>>,
    pub bold: Vec<bool>,
    /// The benchmarks the weighted accuracy weights: those the run evaluated, whichever they
    /// are (a weighted accuracy compares only with one over the same set).
    pub weighted_over: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub model: String,
    pub k: usize,
    pub rows: Vec<Row>,
}

/// Builds Table 1 from run results, a column per benchmark of [`Benchmark::ALL`].
pub fn table1(runs: &[RunResult]) -> Table1 {
    table1_with(runs, &Benchmark::ALL.map(Column::of))
}

/// Builds Table 1 from run results with these benchmark columns.
pub fn table1_with(runs: &[RunResult], columns: &[Column]) -> Table1 {
    let width = columns.len() + 1;
    let mut groups = Vec::new();
    for model in model_order(runs.iter().map(|r| r.model.clone())) {
        let mut rows = Vec::new();
        let mut k = 0;
        for method in AlgorithmKind::ALL {
            let Some(best) = runs
                .iter()
                .filter(|r| r.model == model && r.algorithm == method)
                .find_map(RunResult::best)
            else {
                continue;
            };
            let mut values = vec![None; width];
            values[0] = Some(100.0 * best.weighted_accuracy);
            for (i, c) in columns.iter().enumerate() {
                if let Some(r) = best.benchmarks.iter().find(|r| r.benchmark == c.name) {
                    values[i + 1] = Some(100.0 * r.avg_at_k);
                    k = r.k;
                }
            }
            rows.push(Row {
                method,
                step: best.step,
                values,
                bold: vec![false; width],
                weighted_over: best
                    .benchmarks
                    .iter()
                    .map(|b| b.benchmark.clone())
                    .collect(),
            });
        }
        bold_the_better_of_each_pair(&mut rows);
        groups.push(Group { model, k, rows });
    }
    Table1 {
        columns: columns.to_vec(),
        groups,
    }
}

/// Bolds the better of each matched pair, column by column (both on a tie).
fn bold_the_better_of_each_pair(rows: &mut [Row]) {
    for (base, ac) in [
        (AlgorithmKind::Ppo, AlgorithmKind::PpoAc),
        (AlgorithmKind::Grpo, AlgorithmKind::GrpoAc),
    ] {
        let (Some(bi), Some(ai)) = (
            rows.iter().position(|r| r.method == base),
            rows.iter().position(|r| r.method == ac),
        ) else {
            continue;
        };
        for c in 0..rows[bi].values.len() {
            if let (Some(x), Some(y)) = (rows[bi].values[c], rows[ai].values[c]) {
                let (x, y) = (round1(x), round1(y));
                rows[bi].bold[c] = x >= y;
                rows[ai].bold[c] = y >= x;
            }
        }
    }
}

/// Values are compared as printed (one decimal), so bold never contradicts the table.
fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn cell(v: Option<f64>, bold: bool, md: bool) -> String {
    match v {
        None => "–".into(),
        Some(x) if bold && md => format!("**{x:.1}**"),
        Some(x) if bold => format!("\\textbf{{{x:.1}}}"),
        Some(x) => format!("{x:.1}"),
    }
}

/// A row's value cells, in Markdown or LaTeX.
fn cells(r: &Row, md: bool) -> impl Iterator<Item = String> + '_ {
    r.values
        .iter()
        .zip(&r.bold)
        .map(move |(v, b)| cell(*v, *b, md))
}

pub fn markdown(table: &Table1) -> String {
    let numbers = table.headings().chain(["best step"]).map(|h| (h, Right));
    let mut t = Table::new([("Method", Left)].into_iter().chain(numbers));
    for g in &table.groups {
        let title = format!("**{}** (avg@{})", g.model, g.k);
        let blanks = table.columns.len() + 2;
        t.row(
            [title]
                .into_iter()
                .chain(std::iter::repeat_n(String::new(), blanks)),
        );
        for r in &g.rows {
            let method = r.method.paper_name().to_string();
            t.row(
                [method]
                    .into_iter()
                    .chain(cells(r, true))
                    .chain([r.step.to_string()]),
            );
        }
    }
    t.to_string()
}

pub fn latex(table: &Table1) -> String {
    let values = table.columns.len() + 1;
    let mut s = format!("\\begin{{tabular}}{{l{}}}\n\\toprule\n", "r".repeat(values));
    let header: Vec<&str> = std::iter::once("Method").chain(table.headings()).collect();
    s.push_str(&format!("{} \\\\\n\\midrule\n", header.join(" & ")));
    for (i, g) in table.groups.iter().enumerate() {
        if i > 0 {
            s.push_str("\\midrule\n");
        }
        s.push_str(&format!(
            "\\multicolumn{{{}}}{{l}}{{\\textbf{{{}}} (avg@{})}} \\\\\n",
            values + 1,
            g.model,
            g.k
        ));
        for r in &g.rows {
            let cells: Vec<String> = cells(r, false).collect();
            s.push_str(&format!(
                "{} & {} \\\\\n",
                r.method.paper_name(),
                cells.join(" & ")
            ));
        }
    }
    s.push_str("\\bottomrule\n\\end{tabular}\n");
    s
}

/// The CSV's value columns: `weighted_acc`, then each benchmark's heading in snake case.
fn csv_keys(columns: &[Column]) -> Vec<String> {
    std::iter::once(WEIGHTED_CSV.to_string())
        .chain(columns.iter().map(Column::csv_key))
        .collect()
}

/// CSV in the layout of [`PAPER_TABLE1`] (plus the best step).
pub fn csv(table: &Table1) -> String {
    let mut s = format!(
        "model,avg_k,method,{},best_step\n",
        csv_keys(&table.columns).join(",")
    );
    for g in &table.groups {
        for r in &g.rows {
            let v: Vec<String> = r
                .values
                .iter()
                .map(|x| x.map_or(String::new(), |x| format!("{x:.1}")))
                .collect();
            s.push_str(&format!(
                "{},{},{},{},{}\n",
                g.model,
                g.k,
                r.method.paper_name(),
                v.join(","),
                r.step
            ));
        }
    }
    s
}

/// The paper's values in the columns `keys` (CSV headers) per (model, method), from a CSV in
/// the layout of [`PAPER_TABLE1`], read by its header: a column it does not have is None.
fn paper_values(paper_csv: &str, keys: &[String]) -> BTreeMap<(String, String), Vec<Option<f64>>> {
    let mut lines = paper_csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let at: Vec<Option<usize>> = keys
        .iter()
        .map(|k| header.iter().position(|h| h == k))
        .collect();
    let mut paper = BTreeMap::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() >= header.len() {
            paper.insert(
                (f[0].to_string(), f[2].to_string()),
                at.iter()
                    .map(|i| i.and_then(|i| f[i].parse().ok()))
                    .collect(),
            );
        }
    }
    paper
}

/// Ours beside the paper's reported values (paper | ours | Δ) for the weighted column and each
/// benchmark, for the models and methods present in both. The paper's CSV is read by its
/// header, so a column it does not have is left out. The paper weights its accuracy over the
/// benchmarks of its header; a run whose weighted accuracy is over another set is not set
/// beside it but listed below the table, saying why.
pub fn compare_paper(table: &Table1, paper_csv: &str) -> String {
    let header: Vec<&str> = paper_csv.lines().next().unwrap_or("").split(',').collect();
    let paper_set: BTreeSet<String> = header
        .iter()
        .skip_while(|h| **h != WEIGHTED_CSV)
        .skip(1)
        .map(|h| h.to_string())
        .collect();
    // a run's benchmarks as the paper's header names them (a benchmark without a column of
    // the table keeps its own name, which no paper column has)
    let as_csv = |benchmark: &str| {
        table
            .columns
            .iter()
            .find(|c| c.name == benchmark)
            .map_or(benchmark.to_string(), Column::csv_key)
    };
    let mut not_compared = Vec::new();
    let paper = paper_values(paper_csv, &csv_keys(&table.columns));
    let mut t = Table::new([
        ("model", Left),
        ("method", Left),
        ("column", Left),
        ("paper", Right),
        ("ours", Right),
        ("Δ", Right),
    ]);
    for g in &table.groups {
        for r in &g.rows {
            let Some(p) = paper.get(&(g.model.clone(), r.method.paper_name().to_string())) else {
                continue;
            };
            let ours_set: BTreeSet<String> =
                r.weighted_over.iter().map(|b| as_csv(b.as_str())).collect();
            for (c, name) in table.headings().enumerate() {
                if c == 0 && r.values[0].is_some() && ours_set != paper_set {
                    not_compared.push(format!(
                        "- {} {}: our weighted accuracy is over {}, the paper's over {}",
                        g.model,
                        r.method.paper_name(),
                        ours_set.iter().cloned().collect::<Vec<_>>().join(", "),
                        paper_set.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                    continue;
                }
                if let (Some(ours), Some(theirs)) = (r.values[c], p[c]) {
                    t.row([
                        g.model.clone(),
                        r.method.paper_name().into(),
                        name.to_string(),
                        format!("{theirs:.1}"),
                        format!("{ours:.1}"),
                        format!("{:+.1}", ours - theirs),
                    ]);
                }
            }
        }
    }
    let mut out = t.to_string();
    if !not_compared.is_empty() {
        out.push_str(
            "\nWeighted accuracies not compared (over other benchmarks than the paper's):\n",
        );
        out.push_str(&not_compared.join("\n"));
        out.push('\n');
    }
    out
}

/// Steps for an -AC run to reach its baseline's best weighted accuracy.
#[derive(Debug, Clone, PartialEq)]
pub struct Speedup {
    pub model: String,
    pub baseline: AlgorithmKind,
    pub baseline_best: f64,
    pub baseline_step: usize,
    /// First step where the -AC run is at least as good; None if it never is.
    pub ac_step: Option<usize>,
    /// baseline_step / ac_step; None when undefined (never reached, or reached at step 0).
    pub speedup: Option<f64>,
}

pub fn speedups(runs: &[RunResult]) -> Vec<Speedup> {
    let mut out = Vec::new();
    for model in model_order(runs.iter().map(|r| r.model.clone())) {
        for (base, ac) in [
            (AlgorithmKind::Ppo, AlgorithmKind::PpoAc),
            (AlgorithmKind::Grpo, AlgorithmKind::GrpoAc),
        ] {
            let find =
                |m: AlgorithmKind| runs.iter().find(|r| r.model == model && r.algorithm == m);
            let (Some(b), Some(a)) = (find(base), find(ac)) else {
                continue;
            };
            let Some(best) = b.best() else { continue };
            let ac_step = a.first_reaching(best.weighted_accuracy).map(|e| e.step);
            let speedup = match ac_step {
                Some(s) if s > 0 && best.step > 0 => Some(best.step as f64 / s as f64),
                _ => None,
            };
            out.push(Speedup {
                model: model.clone(),
                baseline: base,
                baseline_best: best.weighted_accuracy,
                baseline_step: best.step,
                ac_step,
                speedup,
            });
        }
    }
    out
}

/// The regime a run trained in (issue #22): where its policy's entropy started and ended, how
/// often its own clip acted, how far off-policy its later mini-batches were (ppo_kl, and the
/// spread of r in the first, on-policy mini-batch against the later ones), how often the ratio
/// clip and ACPO's clip would have treated the later mini-batches' tokens differently, the tail
/// of |r·Â|, and its prompts' spread over difficulty at the tail steps (means over steps of
/// `metrics.jsonl`; "—" where the run logged no such metric, e.g. runs older than it).
pub fn regime_markdown(runs: &[RunResult]) -> Result<String> {
    let mut t = Table::new([
        ("model", Left),
        ("method", Left),
        ("steps", Right),
        ("entropy, first step", Right),
        ("entropy, last step", Right),
        ("own clip active, all / later mini-batches", Right),
        ("ppo_kl", Right),
        ("later: ratio clip zeroes, ACPO keeps", Right),
        ("later: ACPO zeroes, ratio clip keeps", Right),
        ("r p1–p99, first mini-batch", Right),
        ("r p1–p99, later ones", Right),
        ("\\|r·Â\\| p99, first / later", Right),
        ("prompts easy / medium / hard", Right),
    ]);
    for model in model_order(runs.iter().map(|r| r.model.clone())) {
        let mut of_model: Vec<&RunResult> = runs.iter().filter(|r| r.model == model).collect();
        of_model.sort_by_key(|r| AlgorithmKind::ALL.iter().position(|a| *a == r.algorithm));
        for r in of_model {
            let lines = load_metrics(&r.dir)?;
            let mean = |key: &str| -> Option<f64> {
                let v: Vec<f64> = lines.iter().filter_map(|m| m.get(key).copied()).collect();
                (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
            };
            let entropy = |m: Option<&BTreeMap<String, f64>>| {
                m.and_then(|m| m.get(crate::run::metric::ENTROPY))
                    .map_or("—".into(), |e| format!("{e:.3}"))
            };
            let pct = |v: Option<f64>| v.map_or("—".into(), |v| format!("{:.3} %", 100.0 * v));
            let own = r.clip.own_clip_metric();
            let prompts = figures::run_tails(&r.dir)?.map_or("—".into(), |(_, p)| {
                let n = p.iter().sum::<usize>().max(1) as f64;
                format!(
                    "{:.0} / {:.0} / {:.0} %",
                    100.0 * p[0] as f64 / n,
                    100.0 * p[1] as f64 / n,
                    100.0 * p[2] as f64 / n
                )
            });
            let range = |at: &str| match (
                mean(&format!("actor/ratio_p01_{at}")),
                mean(&format!("actor/ratio_p99_{at}")),
            ) {
                (Some(lo), Some(hi)) => format!("{lo:.3}–{hi:.3}"),
                _ => "—".into(),
            };
            let tail = |at: &str| {
                mean(&format!("actor/ratio_adv_abs_p99_{at}"))
                    .map_or("—".into(), |v| format!("{v:.2}"))
            };
            t.row([
                model.clone(),
                r.algorithm.paper_name().into(),
                lines.len().to_string(),
                entropy(lines.first()),
                entropy(lines.last()),
                format!(
                    "{} / {}",
                    pct(mean(own)),
                    pct(mean(&format!("{own}_later")))
                ),
                mean("actor/ppo_kl").map_or("—".into(), |v| format!("{v:.1e}")),
                pct(mean("actor/clip_disagree_ratio_zeroes_later")),
                pct(mean("actor/clip_disagree_acpo_zeroes_later")),
                range("first"),
                range("later"),
                format!("{} / {}", tail("first"), tail("later")),
                prompts,
            ]);
        }
    }
    Ok(t.to_string())
}

/// Mean speedup per baseline family over the models where it is defined.
pub fn mean_speedup(all: &[Speedup], baseline: AlgorithmKind) -> Option<f64> {
    let v: Vec<f64> = all
        .iter()
        .filter(|s| s.baseline == baseline)
        .filter_map(|s| s.speedup)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

pub fn speedup_markdown(all: &[Speedup]) -> String {
    let mut t = Table::new([
        ("model", Left),
        ("vs", Left),
        ("baseline best (weighted)", Right),
        ("at step", Right),
        ("-AC reaches it at step", Right),
        ("speedup", Right),
    ]);
    for x in all {
        t.row([
            x.model.clone(),
            x.baseline.paper_name().into(),
            format!("{:.1}", 100.0 * x.baseline_best),
            x.baseline_step.to_string(),
            x.ac_step.map_or("never".into(), |v| v.to_string()),
            x.speedup.map_or("n/a".into(), |v| format!("{v:.2}×")),
        ]);
    }
    let mut s = t.to_string();
    for base in [AlgorithmKind::Ppo, AlgorithmKind::Grpo] {
        let m = mean_speedup(all, base).map_or("n/a".into(), |v| format!("{v:.2}×"));
        s.push_str(&format!("\nMean speedup over {}: {m}", base.paper_name()));
    }
    s.push('\n');
    s
}

/// What `acpo report` and `acpo reproduce` build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Artifact {
    Table1,
    Accuracy,
    Entropy,
    Tails,
    Speedup,
    All,
}

impl Artifact {
    fn wants(self, a: Artifact) -> bool {
        self == Artifact::All || self == a
    }
}

/// Writes `artifact` from the run directories in `root` (a `results/<scale>` directory): the
/// tables into `root`, the figures into `figures/<name of root>/`; with `compare_paper`, also
/// `table1_vs_paper.md`. Returns the Markdown printed for the user and the files written.
pub fn write(
    artifact: Artifact,
    root: &Path,
    figures: &Path,
    compare_paper_too: bool,
) -> Result<(String, Vec<PathBuf>)> {
    write_from(artifact, &[root], root, figures, compare_paper_too)
}

/// As [`write()`], from the run directories of several folders read together (such as two
/// archives' unpacked runs, for one verdict over all their pairs), the reports written into
/// `root`. A (model, method, seed) found twice is refused: a pair must know its runs.
pub fn write_from(
    artifact: Artifact,
    sources: &[&Path],
    root: &Path,
    figures: &Path,
    compare_paper_too: bool,
) -> Result<(String, Vec<PathBuf>)> {
    let mut runs: Vec<RunResult> = Vec::new();
    for source in sources {
        for r in load_results(source)? {
            if let Some(twin) = runs
                .iter()
                .find(|o| o.model == r.model && o.algorithm == r.algorithm && o.seed == r.seed)
            {
                return Err(ReportError::Invalid {
                    path: r.dir.clone(),
                    reason: format!(
                        "a second run of {} {} seed {} (the first: {})",
                        r.model,
                        r.algorithm.paper_name(),
                        r.seed,
                        twin.dir.display()
                    ),
                });
            }
            runs.push(r);
        }
    }
    if runs.is_empty() {
        return Err(ReportError::Invalid {
            path: sources.first().map_or(root, |s| *s).to_owned(),
            reason: "no run directories with eval.jsonl (train first: acpo train MANIFEST)".into(),
        });
    }
    // With several seeds, the single-run artifacts are the first seed's; seeds.md, verdict.md
    // and the bands of the accuracy and entropy curves cover them all.
    let all = runs;
    let runs = seeds::first_seed(&all);
    let scale = root
        .file_name()
        .map_or("results".into(), |n| n.to_string_lossy().to_string());
    let figures = figures.join(scale);
    // Every table and figure is staged first and put in place together (issue #47): a failure
    // on the way leaves the earlier set whole, never this run's first files beside the old rest.
    let mut set = crate::atomic::FileSet::new("report");
    let shown = stage(
        artifact,
        root,
        &figures,
        &all,
        &runs,
        compare_paper_too,
        &mut set,
    )?;
    let written = set.files();
    set.commit().at(root)?;
    Ok((shown, written))
}

/// Writes `artifact`'s tables (into `root`) and figures (into `figures`) into `set`; the
/// Markdown shown to the user.
fn stage(
    artifact: Artifact,
    root: &Path,
    figures: &Path,
    all: &[RunResult],
    runs: &[RunResult],
    compare_paper_too: bool,
    set: &mut crate::atomic::FileSet,
) -> Result<String> {
    let mut shown = String::new();
    let put = |set: &mut crate::atomic::FileSet, name: &str, body: &str| -> Result<()> {
        set.write(root, name, body.as_bytes()).at(root.join(name))?;
        Ok(())
    };
    if artifact.wants(Artifact::Table1) {
        let groups = table1(runs);
        put(set, "table1.md", &markdown(&groups))?;
        put(set, "table1.tex", &latex(&groups))?;
        put(set, "table1.csv", &csv(&groups))?;
        put(set, "regime.md", &regime_markdown(runs)?)?;
        if compare_paper_too {
            put(
                set,
                "table1_vs_paper.md",
                &compare_paper(&groups, PAPER_TABLE1),
            )?;
        }
        shown.push_str(&markdown(&groups));
    }
    if artifact.wants(Artifact::Table1) && seeds::several(all) {
        let pairs = seeds::pairs(all)?;
        let md = seeds::markdown(&pairs);
        put(set, "seeds.md", &md)?;
        put(set, "verdict.md", &verdict::markdown(&pairs))?;
        put(set, "power.md", &seeds::power_markdown(&pairs))?;
        shown.push_str(&md);
    }
    if artifact.wants(Artifact::Speedup) {
        let md = speedup_markdown(&speedups(runs));
        put(set, "speedup.md", &md)?;
        shown.push_str(&md);
    }
    let drawn = [Artifact::Accuracy, Artifact::Entropy, Artifact::Tails];
    if !drawn.iter().any(|a| artifact.wants(*a)) {
        return Ok(shown);
    }
    let staged = set.folder(figures).at(figures)?;
    if artifact.wants(Artifact::Accuracy) {
        let files = figures::accuracy(all, &staged)?;
        set.adopt(figures, files);
    }
    if artifact.wants(Artifact::Entropy) {
        let files = figures::entropy(all, &staged)?;
        set.adopt(figures, files);
    }
    if artifact.wants(Artifact::Tails) {
        let (t, masses) = figures::tails(runs, &staged)?;
        if !masses.is_empty() {
            put(set, "tails.md", &masses)?;
        }
        if t.is_empty() && artifact == Artifact::Tails {
            return Err(ReportError::Invalid {
                path: root.to_owned(),
                reason: "no run has tails/ (set trainer.tails_every > 0)".into(),
            });
        }
        set.adopt(figures, t);
    }
    Ok(shown)
}
