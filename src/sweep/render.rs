//! A sweep's table and figure, and a comparison's across sweeps: Markdown through
//! [`crate::report::table`], figures through [`crate::report::plot`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::points::PointResult;
use super::{GridValue, Result, Spec, Sweep, SweepError};
use crate::algo::clip::ClipFamily;
use crate::report::figures::method_color;
use crate::report::plot::{shade, tint, write_figure, Panel, Series, Ticks, PALETTE};
use crate::report::seeds::Interval;
use crate::report::table::{Align::Left, Align::Right, Table};
use crate::report::ReportError;

fn plain(i: &Option<Interval>) -> String {
    i.as_ref().map_or("—".into(), |i| i.show_unsigned(1))
}

/// The fields that set the off-policy degree, the policy updates per training step
/// ([`crate::manifest::ActorSpec::updates_per_step`]): a comparison's columns.
const DEGREE_FIELDS: [&str; 3] = [
    "actor.mini_batch_size",
    "actor.epochs",
    "trainer.batch_size",
];

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
/// step (on a log2 axis labelled with the counts), one line per rule with its 95 % intervals
/// as error bars (the rules side by side at each degree), one legend below the panels.
pub(super) fn comparison_figure(
    panels: &[ComparisonPanel],
    title: &str,
    stem: &Path,
) -> Result<Vec<PathBuf>> {
    type Of = fn(&PointResult) -> &Option<Interval>;
    let measures: [(&str, Of); 2] = [("best", |p| &p.delta_best), ("final", |p| &p.delta_final)];
    let mut drawn = Vec::new();
    for panel in panels {
        let n = panel.rows.len();
        let colors = rule_colors(panel);
        let log2 = |u: usize| (u as f64).log2();
        let right = panel.columns.iter().map(|&u| log2(u)).fold(0.0, f64::max);
        let ticks: Vec<(f64, String)> = panel
            .columns
            .iter()
            .map(|&u| (log2(u), u.to_string()))
            .collect();
        for (name, of) in measures {
            let series = panel
                .rows
                .iter()
                .zip(&colors)
                .enumerate()
                .map(|(i, ((row, cells), &color))| {
                    // side by side: the rules spread over ±0.2 around each degree
                    let dodge = if n > 1 {
                        0.4 * (i as f64 / (n - 1) as f64 - 0.5)
                    } else {
                        0.0
                    };
                    let at: Vec<(f64, &Interval)> = cells
                        .iter()
                        .filter_map(|(&u, p)| of(p).as_ref().map(|d| (log2(u) + dodge, d)))
                        .collect();
                    Series {
                        label: row.clone(),
                        color,
                        points: at.iter().map(|(x, d)| (*x, d.mean)).collect(),
                        band: at.iter().map(|(x, d)| d.band_at(*x)).collect(),
                    }
                })
                .collect();
            drawn.push(Panel {
                title: format!("Δ {name} against {}", panel.baseline),
                x_desc: "policy updates per step (log scale)".into(),
                y_desc: format!("Δ {name}, points (95 % CI)"),
                series,
                x_range: Some((-0.5, right + 0.5)),
                x_ticks: Ticks::Named(ticks.clone()),
                error_bars: true,
                ..Panel::default()
            });
        }
    }
    Ok(write_figure(stem, title, &drawn, 2).map_err(ReportError::from)?)
}

/// A colour per rule of a comparison panel by its family, the methods' colours kept: ACPO's
/// rules in its -AC method's colour from light (smallest α) to dark (largest), the ratio clip in
/// its method's, the related work's rules (CISPO, GSPO) in the palette's next colours and the
/// unclipped control in grey.
fn rule_colors(panel: &ComparisonPanel) -> Vec<plotters::style::RGBColor> {
    fn first<'p>(cells: &BTreeMap<usize, &'p PointResult>) -> Option<&'p PointResult> {
        cells.values().next().copied()
    }
    let mut alphas: Vec<f64> = panel
        .rows
        .iter()
        .filter_map(|(_, cells)| first(cells)?.clip.alpha())
        .collect();
    alphas.sort_by(f64::total_cmp);
    alphas.dedup();
    panel
        .rows
        .iter()
        .map(|(_, cells)| {
            let Some(p) = first(cells) else {
                return PALETTE[7];
            };
            match p.clip.family() {
                ClipFamily::Advantage { alpha } => {
                    let rank = alphas.iter().position(|a| *a == alpha).unwrap_or(0) as f64;
                    let t = if alphas.len() > 1 {
                        rank / (alphas.len() - 1) as f64
                    } else {
                        0.5
                    };
                    // light tint → the colour itself → a dark shade
                    let c = method_color(p.kind);
                    if t < 0.5 {
                        tint(c, 0.6 * (1.0 - 2.0 * t))
                    } else {
                        shade(c, 0.55 * (2.0 * t - 1.0))
                    }
                }
                ClipFamily::Ratio => method_color(p.kind),
                // the palette's colours after the four methods', grey kept for no clip
                ClipFamily::Related(k) => PALETTE[4 + k % 3],
                ClipFamily::Unclipped => PALETTE[7],
            }
        })
        .collect()
}

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
    // On log10, ticks at the decades, labelled with the field's own values (0.1, 1, 1e9).
    let x_ticks = if log_x {
        let (lo, hi) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        Ticks::Named(
            (lo..=hi)
                .map(|k| {
                    let decade: f64 = format!("1e{k}").parse().expect("a decade parses");
                    (f64::from(k), crate::algo::method::short(decade))
                })
                .collect(),
        )
    } else {
        Ticks::Auto
    };
    let panel = Panel {
        title: format!("{}: Δ best weighted accuracy vs the baseline", spec.name),
        x_desc: if log_x {
            format!("{x_field} (log scale)")
        } else {
            x_field.clone()
        },
        x_ticks,
        y_desc: "Δ points (95 % CI)".into(),
        series,
        marks: vec![],
        ..Panel::default()
    };
    Ok(write_figure(stem, &spec.name, &[panel], 1).map_err(ReportError::from)?)
}
