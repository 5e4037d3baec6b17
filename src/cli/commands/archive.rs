//! `acpo archive` and `acpo verify`: run directories packed with their SHA256SUMS, and checked.

use crate::cli::{ArchiveArgs, VerifyArgs};
use crate::Outcome;

/// `acpo archive`: the runs packed, SHA256SUMS inside and beside.
pub fn archive(args: &ArchiveArgs) -> anyhow::Result<Outcome> {
    let contents = acpo::archive::Contents {
        checkpoints: !args.no_checkpoints,
    };
    let files = acpo::archive::archive(&args.runs, &args.out, contents)?;
    let out = args.out.display();
    println!("wrote {out} ({files} files, SHA256SUMS inside; {out}.sha256 beside it)");
    Ok(Outcome::Success)
}

/// `acpo verify`: an archive or results directory against its SHA256SUMS (exit 1 on a mismatch).
pub fn verify(args: &VerifyArgs) -> anyhow::Result<Outcome> {
    let report = acpo::archive::verify(&args.target)?;
    println!("{}: {}", args.target.display(), report.describe());
    Ok(Outcome::of(report.ok()))
}
