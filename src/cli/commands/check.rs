//! `acpo check`: every manifest under the paths validated, one line each.

use anyhow::{bail, Context};

use crate::cli::CheckArgs;
use crate::Outcome;

/// `acpo check`: exits 0 when every manifest is valid.
pub fn run(args: &CheckArgs) -> anyhow::Result<Outcome> {
    let report = acpo::manifest::check_all(&args.paths).context("cannot list manifests")?;
    report.valid.iter().for_each(|l| println!("ok  {l}"));
    report.errors.iter().for_each(|e| eprintln!("invalid  {e}"));
    match (report.files, report.errors.len()) {
        (0, _) => bail!("no manifests (*.yaml) found under {:?}", args.paths),
        (n, 0) => println!("{n} manifests valid"),
        (n, bad) => bail!("{bad} of {n} manifests are invalid (see above)"),
    }
    Ok(Outcome::Success)
}
