//! Command-line interface of the `acpo` binary: the clap types ([`args`]) and the dispatch, one
//! line per command. Each command is a function in [`commands`], one file each: it parses its
//! flags, makes one library call and prints what it did; the work is in the library. The
//! helpers here are what several commands share.

mod args;
mod commands;

use std::path::{Path, PathBuf};

use acpo::data::DataLocation;

pub use args::*;

use crate::Outcome;

/// The data directory of a command: its flag, else the default (`acpo::data::default_dir`).
fn data_dir(flag: &Option<PathBuf>) -> DataLocation {
    DataLocation::Dir(flag.clone().unwrap_or_else(acpo::data::default_dir))
}

fn print_written(files: &[PathBuf]) {
    for f in files {
        println!("wrote {}", f.display());
    }
}

/// The command, run.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    use commands::*;
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Doc(args) => doc::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Score(args) => score::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Report(args) => report::run(&args),
        Command::Reproduce(args) => reproduce::run(&args),
        Command::Sweep(args) => sweep::run(&args),
        Command::Archive(args) => archive::archive(&args),
        Command::Verify(args) => archive::verify(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Pmd(args) => pmd::run(&args),
        Command::Pipeline(args) => pipeline::run(&args),
        Command::Model(cmd) => model::run(cmd),
        Command::Export(cmd) => export::run(cmd),
        Command::Import(cmd) => import::run(cmd),
    }
}

/// After reports were written into an archive's unpacked directory (`--from ARCHIVE`), its
/// top-level SHA256SUMS is made again over the runs and the reports, so `acpo verify` of the
/// directory holds (each run keeps the archive's own sums, still checked). A directory given
/// as `--from` is the user's and is left as it is.
fn reseal(from: Option<&Path>, unpacked: &Path) -> anyhow::Result<()> {
    if from.is_some_and(|f| !f.is_dir()) {
        acpo::archive::write_sums(unpacked)?;
    }
    Ok(())
}

/// `--from ARCHIVE`: verifies it (saying what it found) and unpacks it under `results`, staged
/// until [`acpo::reproduce::FromArchive::commit`]; None when the verification failed.
fn unpack(from: &Path, results: &Path) -> anyhow::Result<Option<acpo::reproduce::FromArchive>> {
    let found = acpo::reproduce::from_archive(from, results)?;
    println!("{}: {}", from.display(), found.verification.describe());
    Ok(found.root.is_some().then_some(found))
}

/// `--doc FILE`: the generated files quoted into FILE's marked blocks.
fn fill_doc(doc: Option<&Path>, root: &Path) -> anyhow::Result<Outcome> {
    if let Some(doc) = doc {
        for f in acpo::report::doc::fill(&[doc.to_owned()], root, false)? {
            println!(
                "filled {} generated blocks of {}",
                f.blocks,
                f.doc.display()
            );
        }
    }
    Ok(Outcome::Success)
}
