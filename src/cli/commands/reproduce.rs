//! `acpo reproduce`: an artifact at a scale, training what is missing, or rebuilt from an
//! archive (`--from`).

use std::path::PathBuf;

use anyhow::{bail, Context};

use acpo::manifest::Scale;

use crate::cli::{data_dir, fill_doc, print_written, reseal, unpack, ReproduceArgs};
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
    let paper = Scale::from(args.scale) == Scale::Paper;
    let Some(from) = &args.from else {
        let manifests = acpo::reproduce::select_models(&manifests()?, &args.models)?;
        let data = data_dir(&args.data_dir);
        let seeds = args.seeds.unwrap_or(1);
        acpo::reproduce::train_all(&manifests, seeds, &args.results, &data, args.jobs)?;
        let root = args.results.join(scale);
        let written = super::report::write(args.artifact.into(), &root, &args.figures, paper)?;
        print_written(&written);
        return fill_doc(args.doc.as_deref(), &root);
    };
    // Unpacked into a staging folder, checked, reported and resealed there, and only then put
    // in place: a call that fails on the way leaves the earlier reports whole.
    let Some(found) = unpack(from, &args.results)? else {
        return Ok(Outcome::CheckFailed);
    };
    let root = found
        .root
        .clone()
        .expect("invariant: unpack returns verified runs");
    // The runs the report stands on, checked before any of it is written (issue #47).
    let manifests = manifests().context(
        "the runs of an archive are checked against the scale's manifests (--experiments DIR)",
    )?;
    let expected = acpo::reproduce::check_finished(&manifests, args.seeds, &root, &dir)?;
    println!(
        "{}: {}",
        found.final_path(&root).display(),
        expected.describe()
    );
    let written = super::report::write(args.artifact.into(), &root, &args.figures, paper)?;
    reseal(Some(from), &root)?;
    let written: Vec<PathBuf> = written.iter().map(|w| found.final_path(w)).collect();
    let root = found.commit()?.expect("invariant: verified runs");
    print_written(&written);
    fill_doc(args.doc.as_deref(), &root)
}
