//! What a user sees while runs train: an indicatif bar with ETA on a terminal, one line per
//! event otherwise (logs, CI, runs side by side).

use std::io::IsTerminal;

use crate::run::metric;
use crate::train::{step_line, Event};

/// Progress of a training run: an indicatif bar with ETA on a terminal, one line per event
/// otherwise (logs, CI).
pub fn display(prefix: Option<String>) -> impl FnMut(Event<'_>) {
    // Runs side by side print prefixed lines (bars would overwrite each other).
    let tty = prefix.is_none() && std::io::stderr().is_terminal();
    let p = prefix.map_or(String::new(), |p| format!("[{p}] "));
    let mut bar: Option<indicatif::ProgressBar> = None;
    move |event| match event {
        Event::Start { step, total } => {
            if tty {
                let b = indicatif::ProgressBar::new(total as u64);
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{bar:30} step {pos}/{len}  {elapsed} < {eta}  {msg}",
                ) {
                    b.set_style(style);
                }
                b.set_position(step as u64);
                bar = Some(b);
            } else {
                eprintln!("{p}training from step {step} of {total}");
            }
        }
        Event::Step {
            step,
            total,
            metrics,
        } => match &bar {
            Some(b) => {
                b.set_position(step as u64);
                b.set_message(format!(
                    "acc {:.3}  entropy {:.3}",
                    metrics.get(metric::ACC).copied().unwrap_or(f64::NAN),
                    metrics.get(metric::ENTROPY).copied().unwrap_or(f64::NAN)
                ));
            }
            None => eprintln!("{p}{}", step_line(step, total, metrics)),
        },
        Event::Eval {
            step,
            weighted_accuracy,
        } => {
            let line = format!(
                "eval at step {step}: weighted accuracy {:.2} %",
                100.0 * weighted_accuracy
            );
            match &bar {
                Some(b) => b.println(line),
                None => eprintln!("{p}{line}"),
            }
        }
        Event::WarmStart { step, total, loss } => {
            if tty {
                let b = bar.get_or_insert_with(|| {
                    let b = indicatif::ProgressBar::new(total as u64);
                    if let Ok(style) = indicatif::ProgressStyle::with_template(
                        "{bar:30} warm start {pos}/{len}  {elapsed} < {eta}  {msg}",
                    ) {
                        b.set_style(style);
                    }
                    b
                });
                b.set_position(step as u64);
                b.set_message(format!("loss {loss:.3}"));
                if step == total {
                    b.finish_and_clear();
                    bar = None;
                }
            } else if step == 1 || step.is_multiple_of(50) || step == total {
                eprintln!("{p}warm start {step}/{total}: loss {loss:.4}");
            }
        }
    }
}
