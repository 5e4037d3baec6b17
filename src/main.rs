//! The `acpo` binary: parse flags, call the library, map the outcome to an exit code.
//!
//! Exit codes: 0 success, 1 a check failed (e.g. a checksum mismatch), 2 a usage or input error.

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(outcome) => outcome.exit_code(),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
