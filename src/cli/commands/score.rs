//! `acpo score`: the verifier's verdict on each response of a JSONL file.

use anyhow::Context;

use crate::cli::ScoreArgs;
use crate::Outcome;

/// `acpo score`: each response judged; the lines printed or written.
pub fn run(args: &ScoreArgs) -> anyhow::Result<Outcome> {
    let scored = acpo::reward::score_file(&args.input)?;
    match &args.output {
        Some(o) => {
            acpo::atomic::write(o, scored.lines.as_bytes()).context("cannot write")?;
            println!("{}; wrote {}", scored.summary(), o.display());
        }
        None => {
            print!("{}", scored.lines);
            eprintln!("{}", scored.summary());
        }
    }
    Ok(Outcome::Success)
}
