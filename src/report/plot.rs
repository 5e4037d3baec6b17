//! Figures as PNG and SVG (plotters): panels of line series with a shared layout, used by the
//! report's figures and the theory check's.
//!
//! Text is laid out by ab_glyph with a TrueType font loaded once at run time: `ACPO_FONT`, else
//! DejaVu Sans or Arial from the usual system places.

use crate::files::{AtPath, PathIoError};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

/// Why a figure could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(transparent)]
    Io(#[from] PathIoError),
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
            if let Ok(bytes) = crate::files::read(path) {
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
    /// Where the legend goes (series with an empty label have no entry; with none, no legend):
    /// never over the data.
    pub legend: Legend,
    /// The x axis's ticks.
    pub x_ticks: Ticks,
    /// Draw each series' band as error bars at its points (series offset along x so that their
    /// bars do not overlap) instead of a shaded area: for a few x values and many series.
    pub error_bars: bool,
}

/// Where a panel's legend goes; both keep it off the data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Legend {
    /// One legend for the whole figure, below the panels: each (label, colour) once. For
    /// series that mean the same in every panel (the methods).
    #[default]
    Figure,
    /// The panel's own legend, below its axes: for labels that carry the panel's numbers.
    BelowPanel,
}

/// The x axis's tick marks (one light grid line each; no minor grid).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Ticks {
    /// Round numbers (1, 2 or 5 × 10^k apart), printed without trailing zeros.
    #[default]
    Auto,
    /// Whole numbers only (training steps, iterations), printed as integers.
    Integers,
    /// These positions with these labels (e.g. log2 positions labelled 1, 4, 16).
    Named(Vec<(f64, String)>),
}

impl Ticks {
    /// The tick positions for the axis [lo, hi], and their step (1 for named ticks, whose
    /// labels do not depend on it).
    fn positions(&self, lo: f64, hi: f64) -> (Vec<f64>, f64) {
        match self {
            Ticks::Named(named) => (
                named
                    .iter()
                    .map(|&(x, _)| x)
                    .filter(|x| *x >= lo && *x <= hi)
                    .collect(),
                1.0,
            ),
            Ticks::Auto | Ticks::Integers => {
                let step = tick_step(hi - lo, matches!(self, Ticks::Integers));
                let first = (lo / step - 1e-9).ceil() as i64;
                let last = (hi / step + 1e-9).floor() as i64;
                ((first..=last).map(|k| k as f64 * step).collect(), step)
            }
        }
    }

    /// The label at tick `x` of an axis whose ticks are `step` apart.
    fn label(&self, x: f64, step: f64) -> String {
        match self {
            Ticks::Named(named) => named
                .iter()
                .find(|(at, _)| (at - x).abs() < 1e-9)
                .map(|(_, l)| l.clone())
                .unwrap_or_default(),
            Ticks::Integers => format!("{}", x.round() as i64),
            Ticks::Auto => {
                let decimals = (-step.log10().floor()).max(0.0) as usize;
                let text = format!("{x:.decimals$}");
                // −0 reads as a different number
                if text
                    .trim_start_matches('-')
                    .chars()
                    .all(|c| c == '0' || c == '.')
                {
                    "0".into()
                } else {
                    text
                }
            }
        }
    }
}

/// The smallest round step (1, 2 or 5 × 10^k; whole numbers: at least 1) that puts at most
/// about eight ticks over `span`.
fn tick_step(span: f64, integers: bool) -> f64 {
    let raw = (span / 8.0).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    if integers {
        step.max(1.0).round()
    } else {
        step
    }
}

/// The figures' palette, one home for every colour the project draws: the four methods first
/// (PPO, PPO-AC, GRPO, GRPO-AC, as `report::figures::method_color` gives them), then four more
/// for anything else drawn beside them (matplotlib's tab10 order).
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// `c` mixed with white: `t` = 0 is `c`, 1 is white (a light shade of a series' colour).
pub fn tint(c: RGBColor, t: f64) -> RGBColor {
    let mix = |v: u8| (f64::from(v) + (255.0 - f64::from(v)) * t).round() as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

/// `c` darkened: `t` = 0 is `c`, 1 is black.
pub fn shade(c: RGBColor, t: f64) -> RGBColor {
    let mix = |v: u8| (f64::from(v) * (1.0 - t)).round() as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

/// Legend entries laid out in centred rows within a width: each entry's row and x offset.
struct LegendLayout {
    entries: Vec<(String, RGBColor)>,
    /// (row, x from the area's left) per entry
    at: Vec<(usize, i32)>,
    rows: usize,
}

const LEGEND_FONT: u32 = 15;
const LEGEND_ROW: i32 = 24;
const LEGEND_SWATCH: i32 = 26;

impl LegendLayout {
    fn new(entries: Vec<(String, RGBColor)>, width: i32) -> LegendLayout {
        let font = ("sans-serif", LEGEND_FONT).into_font();
        let widths: Vec<i32> = entries
            .iter()
            .map(|(label, _)| {
                let text = font.box_size(label).map(|(w, _)| w as i32).unwrap_or(0);
                LEGEND_SWATCH + 6 + text + 24
            })
            .collect();
        let mut rows: Vec<Vec<usize>> = Vec::new();
        let mut used = 0;
        for (i, &w) in widths.iter().enumerate() {
            if rows.is_empty() || (used + w > width - 20 && used > 0) {
                rows.push(Vec::new());
                used = 0;
            }
            rows.last_mut().expect("a row").push(i);
            used += w;
        }
        let mut at = vec![(0, 0); entries.len()];
        for (r, row) in rows.iter().enumerate() {
            let total: i32 = row.iter().map(|&i| widths[i]).sum::<i32>() - 24;
            let mut x = ((width - total) / 2).max(0);
            for &i in row {
                at[i] = (r, x);
                x += widths[i];
            }
        }
        LegendLayout {
            entries,
            at,
            rows: rows.len(),
        }
    }

    /// Pixels the legend takes, padding included (0 with no entry).
    fn height(&self) -> i32 {
        if self.entries.is_empty() {
            0
        } else {
            self.rows as i32 * LEGEND_ROW + 12
        }
    }

    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        for ((label, color), &(row, x)) in self.entries.iter().zip(&self.at) {
            let y = 6 + row as i32 * LEGEND_ROW + LEGEND_ROW / 2;
            area.draw(&PathElement::new(
                vec![(x, y), (x + LEGEND_SWATCH, y)],
                color.stroke_width(3),
            ))
            .map_err(|e| e.to_string())?;
            area.draw(&Text::new(
                label.clone(),
                (x + LEGEND_SWATCH + 6, y - (LEGEND_FONT as i32) / 2 - 3),
                ("sans-serif", LEGEND_FONT).into_font(),
            ))
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Each labelled (label, colour) of `series` once, in order.
fn legend_entries<'a>(series: impl Iterator<Item = &'a Series>) -> Vec<(String, RGBColor)> {
    let mut out: Vec<(String, RGBColor)> = Vec::new();
    for s in series.filter(|s| !s.label.is_empty()) {
        if !out.iter().any(|(l, c)| *l == s.label && *c == s.color) {
            out.push((s.label.clone(), s.color));
        }
    }
    out
}

/// The figure's legends: the shared one (below every panel) and each panel's own.
struct Legends {
    figure: LegendLayout,
    panels: Vec<LegendLayout>,
    /// The tallest panel legend: every panel's area grows by it, so the axes stay aligned.
    panel_height: i32,
}

impl Legends {
    fn new(panels: &[Panel], cols: usize) -> Legends {
        let figure = LegendLayout::new(
            legend_entries(
                panels
                    .iter()
                    .filter(|p| p.legend == Legend::Figure)
                    .flat_map(|p| p.series.iter()),
            ),
            PANEL_W * cols as i32,
        );
        let panels: Vec<LegendLayout> = panels
            .iter()
            .map(|p| {
                let entries = if p.legend == Legend::BelowPanel {
                    legend_entries(p.series.iter())
                } else {
                    Vec::new()
                };
                LegendLayout::new(entries, PANEL_W)
            })
            .collect();
        let panel_height = panels.iter().map(LegendLayout::height).max().unwrap_or(0);
        Legends {
            figure,
            panels,
            panel_height,
        }
    }
}

/// A linear f64 axis with our tick positions as its grid lines and none between them
/// (plotters' own key-point wrapper leaves f64 axes without a label formatter).
struct TickedAxis {
    inner: plotters::coord::types::RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ranged for TickedAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

const PANEL_W: i32 = 560;
const PANEL_H: i32 = 420;
const TITLE_H: i32 = 40;

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
    legends: &Legends,
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 26))
        .map_err(|e| e.to_string())?;
    let rows = panels.len().div_ceil(cols);
    let (grid, strip) = root.split_vertically(rows as i32 * (PANEL_H + legends.panel_height));
    legends.figure.draw(&strip)?;
    let areas = grid.split_evenly((rows, cols));
    for ((area, p), legend) in areas.iter().zip(panels).zip(&legends.panels) {
        let (area, below) = area.split_vertically(PANEL_H);
        legend.draw(&below)?;
        draw_panel(&area, p)?;
    }
    root.present().map_err(|e| e.to_string())
}

/// One panel: its axes (log or linear y), marks, bands and series.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
) -> std::result::Result<(), String> {
    let (x0, x1, y0, y1) = p.extent();
    let pad = if p.log_y { 0.0 } else { 0.05 * (y1 - y0) };
    let (floor, top) = if p.log_y {
        (y0, y1 * 1.5)
    } else {
        (y0 - pad, y1 + pad)
    };
    let (ticks, step) = p.x_ticks.positions(x0, x1);
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
                // a light major grid only: the data, not the grid, is what the eye meets
                .bold_line_style(BLACK.mix(0.12))
                .light_line_style(TRANSPARENT)
                .x_label_formatter(&|x: &f64| p.x_ticks.label(*x, step))
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
                let points: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| {
                        *x >= x0 && *x <= x1 && (!p.log_y || p.zero_at_axis || *y > 0.0)
                    })
                    .map(|(x, y)| (x, if p.log_y && y <= 0.0 { floor } else { y }))
                    .collect();
                chart
                    .draw_series(LineSeries::new(points, s.color.stroke_width(2)))
                    .map_err(|e| e.to_string())?;
            }
        }};
    }
    let x_axis = TickedAxis {
        inner: (x0..x1).into(),
        ticks,
    };
    if p.log_y {
        finish!(builder
            .build_cartesian_2d(x_axis, (y0..y1 * 1.5).log_scale())
            .map_err(|e| e.to_string())?);
    } else {
        finish!(builder
            .build_cartesian_2d(x_axis, (y0 - pad)..(y1 + pad))
            .map_err(|e| e.to_string())?);
    }
    Ok(())
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
    let (png, svg) = (stem.with_extension("png"), stem.with_extension("svg"));
    if let Some(dir) = stem.parent() {
        std::fs::create_dir_all(dir).at(dir)?;
    }
    let fail = |path: &Path, reason: String| PlotError::Draw {
        path: path.to_owned(),
        reason,
    };
    // Text is measured with the font in both backends (and the legends' widths with it).
    ensure_font().map_err(|e| fail(&png, e))?;
    let legends = Legends::new(panels, cols);
    let size = (
        (PANEL_W * cols as i32) as u32,
        (rows as i32 * (PANEL_H + legends.panel_height) + TITLE_H + legends.figure.height()) as u32,
    );
    // Each file is drawn under a temporary name (keeping its extension, which picks the
    // encoder) and renamed over the old one when complete: a kill never leaves half a figure.
    // The temporaries are made here, new (never a planted name followed), and removed if the
    // drawing fails; the backends then open them by their paths.
    let (png_tmp, svg_tmp) = (
        crate::atomic::Temp::beside_keeping_extension(&png).at(&png)?,
        crate::atomic::Temp::beside_keeping_extension(&svg).at(&svg)?,
    );
    draw_panels(
        &SVGBackend::new(svg_tmp.path(), size).into_drawing_area(),
        title,
        panels,
        cols,
        &legends,
    )
    .map_err(|e| fail(&svg, e))?;
    draw_panels(
        &BitMapBackend::new(png_tmp.path(), size).into_drawing_area(),
        title,
        panels,
        cols,
        &legends,
    )
    .map_err(|e| fail(&png, e))?;
    for (tmp, path) in [(svg_tmp, &svg), (png_tmp, &png)] {
        tmp.commit(path).at(path)?;
    }
    Ok(vec![png, svg])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_ticks_are_whole_numbers_printed_as_integers() {
        let t = Ticks::Integers;
        let (at, step) = t.positions(0.0, 32.0);
        assert_eq!(at, vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]);
        assert_eq!(t.label(10.0, step), "10");
        // a short axis still steps by whole numbers
        assert_eq!(t.positions(0.0, 3.0).0, vec![0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn round_ticks_drop_trailing_zeros_and_negative_zero() {
        let t = Ticks::Auto;
        let (at, step) = t.positions(-0.6, 0.6);
        assert_eq!(step, 0.2);
        let labels: Vec<String> = at.iter().map(|x| t.label(*x, step)).collect();
        assert_eq!(labels, ["-0.6", "-0.4", "-0.2", "0", "0.2", "0.4", "0.6"]);
    }

    #[test]
    fn named_ticks_sit_at_their_positions_inside_the_axis() {
        let t = Ticks::Named(vec![
            (0.0, "1".into()),
            (2.0, "4".into()),
            (4.0, "16".into()),
        ]);
        assert_eq!(t.positions(-0.5, 3.0).0, vec![0.0, 2.0]);
        assert_eq!(t.label(2.0, 1.0), "4");
    }
}
