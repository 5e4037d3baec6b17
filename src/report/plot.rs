//! Figures as PNG and SVG (plotters): panels of line series with a shared layout, used by the
//! report's figures and the theory check's.
//!
//! Text is laid out by ab_glyph with a TrueType font loaded once at run time: `ACPO_FONT`, else
//! DejaVu Sans or Arial from the usual system places.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

/// Why a figure could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Draw { path: PathBuf, reason: String },
}

type Result<T> = std::result::Result<T, PlotError>;

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

/// A line series: label, colour, points, and optionally a band around them.
pub struct Series {
    pub label: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
    /// (x, low, high), shaded in the series' colour (e.g. a 95 % interval across seeds);
    /// empty: none.
    pub band: Vec<(f64, f64, f64)>,
}

/// One panel of a figure.
#[derive(Default)]
pub struct Panel {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub log_y: bool,
    /// With `log_y`: draw values ≤ 0 at the axis (a step histogram's empty bins) instead of
    /// leaving them out.
    pub zero_at_axis: bool,
    pub series: Vec<Series>,
    /// The x-axis range; default: the data's.
    pub x_range: Option<(f64, f64)>,
    /// x positions marked with dashed vertical lines (e.g. ±α).
    pub marks: Vec<f64>,
    /// Where the legend goes (series with an empty label have no entry; with none, no legend).
    pub legend: Legend,
    /// Draw each series' band as error bars at its points (series offset along x so that their
    /// bars do not overlap) instead of a shaded area: for a few x values and many series.
    pub error_bars: bool,
}

/// A legend's corner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Legend {
    #[default]
    Middle,
    UpperRight,
    LowerLeft,
}

impl Panel {
    /// The axes' extent (x0, x1, y0, y1): the data's (positive y only on a log scale), or
    /// `x_range`, never empty.
    fn extent(&self) -> (f64, f64, f64, f64) {
        let pts = self
            .series
            .iter()
            .flat_map(|s| {
                s.points
                    .iter()
                    .copied()
                    .chain(s.band.iter().flat_map(|&(x, lo, hi)| [(x, lo), (x, hi)]))
            })
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!self.log_y || *y > 0.0));
        let (mut x0, mut x1, mut y0, mut y1) = (
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
        );
        for (x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            (x0, x1, y0, y1) = (0.0, 1.0, if self.log_y { 1e-6 } else { 0.0 }, 1.0);
        }
        if let Some((lo, hi)) = self.x_range {
            (x0, x1) = (lo, hi);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            y1 = y0 + if self.log_y { y0.abs().max(1e-6) } else { 1.0 };
        }
        (x0, x1, y0, y1)
    }
}

/// How a series' band is drawn: a shaded area, or error bars (a vertical line with two caps).
enum BandShape {
    Bar(Vec<(f64, f64)>),
    Area(Vec<(f64, f64)>),
}

/// The panel's bands as shapes with their series' colours; `x_span` sizes the bars' caps (a
/// fiftieth of the x range wide).
fn band_shapes(p: &Panel, x_span: f64) -> Vec<(BandShape, RGBColor)> {
    let cap = x_span / 100.0;
    let mut out = Vec::new();
    for s in p.series.iter().filter(|s| !s.band.is_empty()) {
        if p.error_bars {
            for &(x, lo, hi) in &s.band {
                for line in [
                    vec![(x, lo), (x, hi)],
                    vec![(x - cap, lo), (x + cap, lo)],
                    vec![(x - cap, hi), (x + cap, hi)],
                ] {
                    out.push((BandShape::Bar(line), s.color));
                }
            }
        } else {
            let outline = s
                .band
                .iter()
                .map(|&(x, _, hi)| (x, hi))
                .chain(s.band.iter().rev().map(|&(x, lo, _)| (x, lo)))
                .collect();
            out.push((BandShape::Area(outline), s.color));
        }
    }
    out
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
        let (x0, x1, y0, y1) = p.extent();
        let pad = if p.log_y { 0.0 } else { 0.05 * (y1 - y0) };
        let (floor, top) = if p.log_y {
            (y0, y1 * 1.5)
        } else {
            (y0 - pad, y1 + pad)
        };
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
                for &x in &p.marks {
                    let dash = DashedLineSeries::new(
                        [(x, floor), (x, top)],
                        6,
                        4,
                        BLACK.mix(0.6).stroke_width(1),
                    );
                    chart.draw_series(dash).map_err(|e| e.to_string())?;
                }
                for (shape, color) in band_shapes(p, x1 - x0) {
                    let drawn = match shape {
                        BandShape::Bar(line) => {
                            chart.draw_series([PathElement::new(line, color.stroke_width(1))])
                        }
                        BandShape::Area(outline) => {
                            chart.draw_series([Polygon::new(outline, color.mix(0.18).filled())])
                        }
                    };
                    drawn.map_err(|e| e.to_string())?;
                }
                for s in &p.series {
                    let color = s.color;
                    let points: Vec<(f64, f64)> = s
                        .points
                        .iter()
                        .copied()
                        .filter(|(x, y)| {
                            *x >= x0 && *x <= x1 && (!p.log_y || p.zero_at_axis || *y > 0.0)
                        })
                        .map(|(x, y)| (x, if p.log_y && y <= 0.0 { floor } else { y }))
                        .collect();
                    let drawn = chart
                        .draw_series(LineSeries::new(points, color.stroke_width(2)))
                        .map_err(|e| e.to_string())?;
                    if !s.label.is_empty() {
                        drawn.label(s.label.as_str()).legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                        });
                    }
                }
                if p.series.iter().any(|s| !s.label.is_empty()) {
                    let mut labels = chart.configure_series_labels();
                    match p.legend {
                        Legend::Middle => {}
                        Legend::UpperRight => {
                            labels.position(SeriesLabelPosition::UpperRight);
                        }
                        Legend::LowerLeft => {
                            labels.position(SeriesLabelPosition::LowerLeft);
                        }
                    }
                    labels
                        .label_font(("sans-serif", 14))
                        .border_style(BLACK)
                        .background_style(WHITE.mix(0.85))
                        .draw()
                        .map_err(|e| e.to_string())?;
                }
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
        std::fs::create_dir_all(dir).map_err(|source| PlotError::Io {
            path: dir.to_owned(),
            source,
        })?;
    }
    let fail = |path: &Path, reason: String| PlotError::Draw {
        path: path.to_owned(),
        reason,
    };
    // Text is measured with the font in both backends.
    ensure_font().map_err(|e| fail(&png, e))?;
    // Each file is drawn under a temporary name (keeping its extension, which picks the
    // encoder) and renamed over the old one when complete: a kill never leaves half a figure.
    let (png_tmp, svg_tmp) = (
        crate::atomic::temp_path_keeping_extension(&png),
        crate::atomic::temp_path_keeping_extension(&svg),
    );
    draw_panels(
        &SVGBackend::new(&svg_tmp, size).into_drawing_area(),
        title,
        panels,
        cols,
    )
    .map_err(|e| fail(&svg, e))?;
    draw_panels(
        &BitMapBackend::new(&png_tmp, size).into_drawing_area(),
        title,
        panels,
        cols,
    )
    .map_err(|e| fail(&png, e))?;
    for (tmp, path) in [(&svg_tmp, &svg), (&png_tmp, &png)] {
        crate::atomic::commit(tmp, path).map_err(|source| PlotError::Io {
            path: path.clone(),
            source,
        })?;
    }
    Ok(vec![png, svg])
}
