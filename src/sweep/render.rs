//! A sweep's table and figure, and a comparison's across sweeps: Markdown through
//! [`crate::report::table`], figures through [`crate::report::plot`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::points::PointResult;
use super::{GridValue, Result, Spec, Sweep, SweepError, DEGREE_FIELDS};
use crate::report::plot::{write_figure, Panel, Series};
use crate::report::seeds::Interval;
use crate::report::table::{Align::Left, Align::Right, Table};
use crate::report::ReportError;

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
    let numbers = [
        "seeds",
        "best [95 % CI]",
        "baseline best",
        "Δ best vs baseline [95 % CI]",
        "Δ final vs baseline [95 % CI]",
        "own clip active",
        "baseline's clip active",
    ];
    let fields = spec.grid.keys().map(|f| (f.as_str(), Left));
    let mut t = Table::new(fields.chain(numbers.map(|h| (h, Right))));
    for p in points {
        let values = p.values.iter().map(|(_, v)| v.cell());
        t.row(values.chain([
            p.seeds.to_string(),
            plain(&p.best),
            plain(&p.baseline_best),
            signed(&p.delta_best),
            signed(&p.delta_final),
            share(&p.own_clip),
            share(&p.baseline_clip),
        ]));
    }
    let mut s = t.to_string();
    let against = points
        .iter()
        .find_map(|p| p.baseline.as_deref())
        .map_or(String::new(), |b| format!(" The baseline is {b}."));
    s.push_str(&format!("\nWeighted accuracy in points. Δ = grid point − baseline, paired by seed; intervals are Student's t over seeds. Clip active: the share of update tokens the run's own clip acted on, the mean over its steps, then its seeds.{against}\n"));
    s
}

/// A comparison's panel: one baseline, its rules (rows) by updates per step (columns).
pub(super) struct ComparisonPanel<'a> {
    baseline: String,
    columns: Vec<usize>,
    rows: Vec<(String, BTreeMap<usize, &'a PointResult>)>,
}

/// The sweeps' points grouped by baseline; a row is a rule with the grid values that are
/// neither the algorithm's (in the rule) nor the off-policy degree's (the columns).
pub(super) fn comparison<'a>(
    all: &'a [(&Sweep, Vec<PointResult>)],
) -> Result<Vec<ComparisonPanel<'a>>> {
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
    let columns = panel.columns.iter().map(|&u| (updates(u), Right));
    let mut t = Table::new([(String::new(), Left)].into_iter().chain(columns));
    let (label, of_baseline) = first;
    let baseline = panel.columns.iter().map(|u| {
        let b = panel.rows.iter().find_map(|(_, c)| c.get(u));
        b.map_or("—".into(), |p| of_baseline(p))
    });
    t.row([label.to_string()].into_iter().chain(baseline));
    for (row, cells) in &panel.rows {
        let of_rule = panel
            .columns
            .iter()
            .map(|u| cells.get(u).map_or("—".into(), |p| cell(p)));
        t.row([row.clone()].into_iter().chain(of_rule));
    }
    s.push_str(&t.to_string());
}

pub(super) fn comparison_markdown(
    panels: &[ComparisonPanel],
    names: &[&str],
    seeds: &[usize],
) -> String {
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
pub(super) fn comparison_figure(
    panels: &[ComparisonPanel],
    title: &str,
    stem: &Path,
) -> Result<Vec<PathBuf>> {
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
                    crate::report::plot::Series {
                        label: if legend { row.clone() } else { String::new() },
                        color: PALETTE[i % PALETTE.len()],
                        points: at.iter().map(|(x, d)| (*x, d.mean)).collect(),
                        band: at.iter().map(|(x, d)| d.band_at(*x)).collect(),
                    }
                })
                .collect();
            drawn.push(crate::report::plot::Panel {
                title: format!("Δ {name} against {}", panel.baseline),
                x_desc: "log2 policy updates per step".into(),
                y_desc: format!("Δ {name}, points (95 % CI)"),
                series,
                // room on the right for the legend, off the bars
                x_range: Some((-0.5, right + 5.5)),
                legend: crate::report::plot::Legend::UpperRight,
                error_bars: true,
                ..crate::report::plot::Panel::default()
            });
        }
    }
    Ok(crate::report::plot::write_figure(stem, title, &drawn, 2).map_err(ReportError::from)?)
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
