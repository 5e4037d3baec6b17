//! `acpo sweep`: grids over manifest fields x seeds, each point paired with its baseline.

use crate::cli::{data_dir, fill_doc, reseal, unpack, SweepArgs};
use crate::Outcome;

/// `acpo sweep`: the grids of the specs trained (or rebuilt `--from` an archive) and reported.
pub fn run(args: &SweepArgs) -> anyhow::Result<Outcome> {
    let sweeps = acpo::sweep::load_all(&args.specs)?;
    let data = data_dir(&args.data_dir);
    // An archive's runs are unpacked into a staging folder, reported and resealed there, and
    // only then put in place: a call that fails on the way leaves the earlier reports whole.
    let found = match &args.from {
        Some(from) => match unpack(from, &args.results)? {
            Some(found) => Some(found),
            None => return Ok(Outcome::CheckFailed),
        },
        None => None,
    };
    let unpacked = found.as_ref().and_then(|f| f.root.clone());
    let source = match &unpacked {
        Some(root) => acpo::sweep::Source::Finished(root),
        None => acpo::sweep::Source::Train {
            data: &data,
            jobs: args.jobs,
        },
    };
    let compare = args.compare.as_deref().map(|name| acpo::sweep::Compare {
        name,
        figures: &args.figures,
    });
    let (mut reports, mut written) = acpo::sweep::run(&sweeps, source, &args.results, compare)?;
    if let (Some(root), Some(found)) = (&unpacked, found) {
        reseal(args.from.as_deref(), root)?;
        written = written.iter().map(|w| found.final_path(w)).collect();
        reports = found.final_path(&reports);
        found.commit()?;
    }
    for w in written {
        println!("wrote {}", w.display());
    }
    println!("sweep reports under {}", reports.display());
    fill_doc(args.doc.as_deref(), &reports)
}
