//! `acpo import verl`: verl's logs of a run into a run directory.

use crate::cli::ImportCommand;
use crate::Outcome;

/// `acpo import verl`: verl's logs of a run → a run directory.
pub fn run(cmd: ImportCommand) -> anyhow::Result<Outcome> {
    let ImportCommand::Verl {
        manifest,
        metrics,
        validation_dir,
        out,
    } = cmd;
    let done = acpo::verl::import::import(&manifest, &metrics, &validation_dir, &out)?;
    println!(
        "imported {} steps and {} evaluations ({} samples re-judged) into {}",
        done.steps,
        done.evaluations,
        done.samples,
        done.dir.display()
    );
    if !done.unchecked_ids.is_empty() {
        println!(
            "problem ids of {} not checked: their prepared data is not in the data directory ({})",
            done.unchecked_ids.join(", "),
            acpo::data::default_dir().display()
        );
    }
    if done.non_finite > 0 {
        println!(
            "{} metric values verl logged as NaN or infinite are left out of metrics.jsonl and listed in provenance.json (non_finite_metrics)",
            done.non_finite
        );
    }
    Ok(Outcome::Success)
}
