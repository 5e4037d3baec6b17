//! `acpo report`: an artifact (table, figure) from the run directories of a scale.

use std::path::Path;

use acpo::report::Artifact;

use crate::cli::{fill_doc, print_written, ReportArgs};
use crate::Outcome;

/// `acpo report`: an artifact drawn from existing run directories.
pub fn run(args: &ReportArgs) -> anyhow::Result<Outcome> {
    let root = args.results.join(args.scale.name());
    print_written(&write(
        args.artifact,
        &root,
        &args.figures,
        args.compare_paper,
    )?);
    fill_doc(args.doc.as_deref(), &root)
}

/// `acpo report`: the artifact from the run directories in `root`, shown; the files written.
pub(super) fn write(
    artifact: Artifact,
    root: &Path,
    figures: &Path,
    paper: bool,
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let (shown, written) = acpo::report::write(artifact, root, figures, paper)?;
    print!("{shown}");
    Ok(written)
}
