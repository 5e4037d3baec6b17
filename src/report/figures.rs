//! The paper's figures from `results/` (PNG and SVG, plotters): weighted accuracy vs step per
//! model (Fig. 1), per-benchmark accuracy per model (appendix figures), policy entropy over the
//! first 100 steps (Fig. 2), and r·Â distributions by prompt difficulty (Fig. 3). Every method
//! has one colour everywhere.
//!
//! Text is laid out by ab_glyph with a TrueType font loaded once at run time: `ACPO_FONT`, else
//! DejaVu Sans or Arial from the usual system places.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{model_order, ReportError, RunResult};
use crate::manifest::{AlgorithmKind, Benchmark};
use crate::train::tails::{Histogram, Tails};

type Result<T> = std::result::Result<T, ReportError>;

/// One colour per method, in every figure.
pub fn method_color(m: AlgorithmKind) -> RGBColor {
    match m {
        AlgorithmKind::Ppo => RGBColor(31, 119, 180),
        AlgorithmKind::PpoAc => RGBColor(255, 127, 14),
        AlgorithmKind::Grpo => RGBColor(44, 160, 44),
        AlgorithmKind::GrpoAc => RGBColor(214, 39, 40),
    }
}

const FONT_PLACES: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers the figure font once; the error says where fonts were looked for.
fn ensure_font() -> std::result::Result<(), String> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("ACPO_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_PLACES.iter().map(PathBuf::from))
            .collect();
        for path in &candidates {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no TrueType font for the figures (looked at {}); set ACPO_FONT to a .ttf file",
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
    .clone()
}

/// A line series: label, colour, points.
pub struct Series {
    pub label: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// One panel of a figure.
pub struct Panel {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

fn draw_panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    panels: &[Panel],
    cols: usize,
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 26))
        .map_err(|e| e.to_string())?;
    let rows = panels.len().div_ceil(cols);
    let areas = root.split_evenly((rows, cols));
    for (area, p) in areas.iter().zip(panels) {
        let pts = p
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!p.log_y || *y > 0.0));
        let (mut x0, mut x1, mut y0, mut y1) = (
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
        );
        for (x, y) in pts {
            x0 = x0.min(*x);
            x1 = x1.max(*x);
            y0 = y0.min(*y);
            y1 = y1.max(*y);
        }
        if !x0.is_finite() {
            (x0, x1, y0, y1) = (0.0, 1.0, if p.log_y { 1e-6 } else { 0.0 }, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            y1 = y0 + if p.log_y { y0.abs().max(1e-6) } else { 1.0 };
        }
        let pad = if p.log_y { 0.0 } else { 0.05 * (y1 - y0) };
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(&p.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80);
        macro_rules! finish {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(p.x_desc.as_str())
                    .y_desc(p.y_desc.as_str())
                    .label_style(("sans-serif", 14))
                    .axis_desc_style(("sans-serif", 15))
                    .y_label_formatter(&|y: &f64| {
                        // Log axes span decades: 1e-6, not 0.0000009999999.
                        if p.log_y && (*y < 1e-2 || *y >= 1e4) {
                            format!("{y:.0e}")
                        } else {
                            format!("{}", (*y * 1e4).round() / 1e4)
                        }
                    })
                    .draw()
                    .map_err(|e| e.to_string())?;
                for s in &p.series {
                    let color = s.color;
                    let points: Vec<(f64, f64)> = s
                        .points
                        .iter()
                        .copied()
                        .filter(|(_, y)| !p.log_y || *y > 0.0)
                        .collect();
                    chart
                        .draw_series(LineSeries::new(points, color.stroke_width(2)))
                        .map_err(|e| e.to_string())?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                        });
                }
                chart
                    .configure_series_labels()
                    .label_font(("sans-serif", 14))
                    .border_style(BLACK)
                    .background_style(WHITE.mix(0.85))
                    .draw()
                    .map_err(|e| e.to_string())?;
            }};
        }
        if p.log_y {
            finish!(builder
                .build_cartesian_2d(x0..x1, (y0..y1 * 1.5).log_scale())
                .map_err(|e| e.to_string())?);
        } else {
            finish!(builder
                .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
                .map_err(|e| e.to_string())?);
        }
    }
    root.present().map_err(|e| e.to_string())
}

/// Writes `<stem>.png` and `<stem>.svg`; returns both paths.
pub fn write_figure(
    stem: &Path,
    title: &str,
    panels: &[Panel],
    cols: usize,
) -> Result<Vec<PathBuf>> {
    let cols = cols.max(1).min(panels.len().max(1));
    let rows = panels.len().div_ceil(cols).max(1);
    let size = (560 * cols as u32, 420 * rows as u32 + 40);
    let (png, svg) = (stem.with_extension("png"), stem.with_extension("svg"));
    if let Some(dir) = stem.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
            path: dir.to_owned(),
            source,
        })?;
    }
    let fail = |path: &Path, reason: String| ReportError::Invalid {
        path: path.to_owned(),
        reason,
    };
    // Text is measured with the font in both backends.
    ensure_font().map_err(|e| fail(&png, e))?;
    draw_panels(
        &SVGBackend::new(&svg, size).into_drawing_area(),
        title,
        panels,
        cols,
    )
    .map_err(|e| fail(&svg, e))?;
    draw_panels(
        &BitMapBackend::new(&png, size).into_drawing_area(),
        title,
        panels,
        cols,
    )
    .map_err(|e| fail(&png, e))?;
    Ok(vec![png, svg])
}

/// One line per method of `model`, its points taken from the run by `points`.
fn method_series(
    runs: &[RunResult],
    model: &str,
    points: impl Fn(&RunResult) -> Vec<(f64, f64)>,
) -> Vec<Series> {
    runs_of(runs, model)
        .into_iter()
        .map(|r| Series {
            label: r.algorithm.paper_name().into(),
            color: method_color(r.algorithm),
            points: points(r),
        })
        .collect()
}

fn runs_of<'a>(runs: &'a [RunResult], model: &str) -> Vec<&'a RunResult> {
    let mut v: Vec<&RunResult> = runs.iter().filter(|r| r.model == model).collect();
    v.sort_by_key(|r| AlgorithmKind::ALL.iter().position(|m| *m == r.algorithm));
    v
}

/// Fig. 1: weighted accuracy vs step, one panel per model; and the per-benchmark panels.
pub fn accuracy(runs: &[RunResult], out: &Path) -> Result<Vec<PathBuf>> {
    let models = model_order(runs.iter().map(|r| r.model.clone()));
    let panels: Vec<Panel> = models
        .iter()
        .map(|m| Panel {
            title: m.clone(),
            x_desc: "training step".into(),
            y_desc: "weighted accuracy (%)".into(),
            log_y: false,
            series: method_series(runs, m, |r| {
                r.evals
                    .iter()
                    .map(|e| (e.step as f64, 100.0 * e.weighted_accuracy))
                    .collect()
            }),
        })
        .collect();
    let mut files = write_figure(
        &out.join("accuracy"),
        "Weighted accuracy during training",
        &panels,
        2,
    )?;
    for m in &models {
        let panels: Vec<Panel> = Benchmark::ALL
            .iter()
            .map(|b| Panel {
                title: b.name().into(),
                x_desc: "training step".into(),
                y_desc: "Avg@k (%)".into(),
                log_y: false,
                series: method_series(runs, m, |r| {
                    r.evals
                        .iter()
                        .filter_map(|e| {
                            e.benchmarks
                                .iter()
                                .find(|x| x.benchmark == b.name())
                                .map(|x| (e.step as f64, 100.0 * x.avg_at_k))
                        })
                        .collect()
                }),
            })
            .collect();
        files.extend(write_figure(
            &out.join(format!("accuracy_{}", slug(m))),
            &format!("{m} on benchmarks"),
            &panels,
            2,
        )?);
    }
    Ok(files)
}

/// Fig. 2: policy entropy over the first 100 steps, one panel per model.
pub fn entropy(runs: &[RunResult], out: &Path) -> Result<Vec<PathBuf>> {
    let models = model_order(runs.iter().map(|r| r.model.clone()));
    let mut panels = Vec::new();
    for m in &models {
        let mut series = Vec::new();
        for r in runs_of(runs, m) {
            let metrics = super::load_metrics(&r.dir)?;
            series.push(Series {
                label: r.algorithm.paper_name().into(),
                color: method_color(r.algorithm),
                points: metrics
                    .iter()
                    .filter_map(|l| {
                        Some((*l.get("training/global_step")?, *l.get("actor/entropy")?))
                    })
                    .filter(|(s, _)| *s <= 100.0)
                    .collect(),
            });
        }
        panels.push(Panel {
            title: m.clone(),
            x_desc: "training step".into(),
            y_desc: "policy entropy (nats)".into(),
            log_y: false,
            series,
        });
    }
    write_figure(
        &out.join("entropy"),
        "Policy entropy (first 100 steps)",
        &panels,
        2,
    )
}

/// Sum of a run's tail histograms over all recorded steps, per bucket (easy, medium, hard).
pub fn run_tails(dir: &Path) -> Result<Option<[Histogram; 3]>> {
    let tails_dir = dir.join("tails");
    if !tails_dir.exists() {
        return Ok(None);
    }
    let mut sum: [Histogram; 3] = Default::default();
    let mut any = false;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&tails_dir)
        .map_err(|source| ReportError::Io {
            path: tails_dir.clone(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|source| ReportError::Io {
            path: f.clone(),
            source,
        })?;
        let t: Tails = serde_json::from_str(&text).map_err(|e| ReportError::Invalid {
            path: f.clone(),
            reason: e.to_string(),
        })?;
        for (acc, h) in sum.iter_mut().zip([&t.easy, &t.medium, &t.hard]) {
            acc.merge(h);
        }
        any = true;
    }
    Ok(any.then_some(sum))
}

/// Fig. 3: the density of r·Â for easy / medium / hard prompts, per method (log scale), one
/// figure per model.
pub fn tails(runs: &[RunResult], out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for m in model_order(runs.iter().map(|r| r.model.clone())) {
        let mut per_method = Vec::new();
        for r in runs_of(runs, &m) {
            if let Some(h) = run_tails(&r.dir)? {
                per_method.push((r.algorithm, h));
            }
        }
        if per_method.is_empty() {
            continue;
        }
        let panels: Vec<Panel> = [
            "easy prompts (70–100 %)",
            "medium prompts (30–70 %)",
            "hard prompts (0–30 %)",
        ]
        .iter()
        .enumerate()
        .map(|(i, title)| Panel {
            title: title.to_string(),
            x_desc: "r·Â".into(),
            y_desc: "density".into(),
            log_y: true,
            series: per_method
                .iter()
                .map(|(alg, h)| Series {
                    label: alg.paper_name().into(),
                    color: method_color(*alg),
                    points: h[i].density(),
                })
                .collect(),
        })
        .collect();
        files.extend(write_figure(
            &out.join(format!("tails_{}", slug(&m))),
            &format!("r·Â by prompt difficulty, {m}"),
            &panels,
            3,
        )?);
    }
    Ok(files)
}

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}
