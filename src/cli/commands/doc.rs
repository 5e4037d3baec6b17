//! `acpo doc`: documents' generated blocks filled from a folder, or checked.

use crate::cli::DocArgs;
use crate::Outcome;

/// `acpo doc`: documents filled from a folder, or (`--check`) told whether they are current.
pub fn run(args: &DocArgs) -> anyhow::Result<Outcome> {
    let filled = acpo::report::doc::fill(&args.docs, &args.from, args.check)?;
    let mut stale = Vec::new();
    for f in &filled {
        match (args.check, f.changed) {
            (true, true) => stale.push(f.doc.display().to_string()),
            (true, false) => println!("{}: {} generated blocks current", f.doc.display(), f.blocks),
            (false, _) => println!(
                "filled {} generated blocks of {}",
                f.blocks,
                f.doc.display()
            ),
        }
    }
    if !stale.is_empty() {
        eprintln!(
            "generated blocks out of date (rerun without --check): {}",
            stale.join(", ")
        );
    }
    Ok(Outcome::of(stale.is_empty()))
}
