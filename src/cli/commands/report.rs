//! `acpo report`: an artifact (table, figure) from the run directories of a scale.

use std::path::{Path, PathBuf};

use acpo::files::AtPath;
use acpo::report::Artifact;

use crate::cli::{fill_doc, print_written, ReportArgs};
use crate::Outcome;

/// `acpo report`: an artifact drawn from existing run directories.
pub fn run(args: &ReportArgs) -> anyhow::Result<Outcome> {
    if let Some(out) = &args.out {
        let sources: Vec<&Path> = args.runs.iter().map(PathBuf::as_path).collect();
        for s in &sources {
            if !s.is_dir() {
                anyhow::bail!(acpo::report::ReportError::Invalid {
                    path: s.to_path_buf(),
                    reason: "--runs: not a folder of run directories".into(),
                });
            }
        }
        std::fs::create_dir_all(out).at(out)?;
        let (shown, written) = acpo::report::write_from(
            args.artifact.into(),
            &sources,
            out,
            &args.figures,
            args.compare_paper,
        )?;
        print!("{shown}");
        print_written(&written);
        return fill_doc(args.doc.as_deref(), out);
    }
    let scale: acpo::manifest::Scale = args.scale.into();
    let root = args.results.join(scale.name());
    print_written(&write(
        args.artifact.into(),
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
