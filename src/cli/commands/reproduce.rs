//! `acpo reproduce`: an artifact at a scale, training what is missing, or rebuilt from an
//! archive (`--from`).

use std::path::PathBuf;

use anyhow::{bail, Context};

use acpo::manifest::Scale;

use crate::cli::{data_dir, fill_doc, reseal, unpack, ReproduceArgs};
use crate::Outcome;

/// `acpo reproduce`: train what is missing at a scale (finished runs are reused, unfinished
/// ones resumed), then build the artifact; or, with --from, verify and rebuild from results.
pub fn run(args: &ReproduceArgs) -> anyhow::Result<Outcome> {
    let scale = Scale::from(args.scale).name();
    let dir = args.experiments.join(scale);
    let manifests = || -> anyhow::Result<Vec<PathBuf>> {
        let manifests = acpo::manifest::discover(&dir)?;
        if manifests.is_empty() {
            bail!("{}: no manifests for scale {scale}", dir.display());
        }
        Ok(manifests)
    };
    let root = match &args.from {
        Some(from) => {
            let Some(root) = unpack(from, &args.results)? else {
                return Ok(Outcome::CheckFailed);
            };
            // The runs the report stands on, checked before any of it is written (issue #47).
            let manifests = manifests().context(
                "the runs of an archive are checked against the scale's manifests (--experiments DIR)",
            )?;
            let expected = acpo::reproduce::check_finished(&manifests, args.seeds, &root, &dir)?;
            println!("{}: {}", root.display(), expected.describe());
            root
        }
        None => {
            let manifests = acpo::reproduce::select_models(&manifests()?, &args.models)?;
            let data = data_dir(&args.data_dir);
            let seeds = args.seeds.unwrap_or(1);
            acpo::reproduce::train_all(&manifests, seeds, &args.results, &data, args.jobs)?;
            args.results.join(scale)
        }
    };
    super::report::write(
        args.artifact.into(),
        &root,
        &args.figures,
        Scale::from(args.scale) == Scale::Paper,
    )?;
    reseal(args.from.as_deref(), &root)?;
    fill_doc(args.doc.as_deref(), &root)
}
