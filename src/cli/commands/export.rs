//! `acpo export verl`: a manifest as verl's launch, with its field-by-field account.

use std::path::Path;

use acpo::manifest::Experiment;

use crate::cli::{data_dir, print_written, ExportCommand};
use crate::Outcome;

/// `acpo export verl`: the manifest's verl launch and its field-by-field account, and with
/// `--data` the parquet files.
pub fn run(cmd: ExportCommand) -> anyhow::Result<Outcome> {
    let ExportCommand::Verl {
        manifest,
        out,
        gpus,
        nodes,
        data,
        data_dir: dir,
    } = cmd;
    let target = acpo::verl::Target {
        gpus_per_node: gpus,
        nodes,
    };
    let out = match out {
        Some(out) => out,
        None => {
            let name = Experiment::load(&manifest)?.name;
            Path::new("results/verl").join(name)
        }
    };
    let from = data_dir(&dir);
    let done = acpo::verl::export(&manifest, &out, &target, data.then_some(&from))?;
    for n in &done.unsupported {
        println!("unsupported by verl: {} ({})", n.field, n.why);
    }
    print_written(&[done.script, done.fields]);
    for w in &done.data {
        println!("wrote {} ({} rows)", w.path.display(), w.rows);
    }
    Ok(Outcome::Success)
}
