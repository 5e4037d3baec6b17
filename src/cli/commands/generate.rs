//! `acpo generate`: completions sampled from a model.

use anyhow::Context;

use crate::cli::GenerateArgs;
use crate::Outcome;

/// `acpo generate`: sample completions and print them (or write JSONL).
pub fn run(args: &GenerateArgs) -> anyhow::Result<Outcome> {
    let lines = acpo::generate::generate(&args.options())?;
    match &args.output {
        Some(out) => {
            acpo::atomic::write(out, acpo::generate::jsonl(&lines).as_bytes())
                .context("cannot write")?;
            println!("wrote {} completions to {}", lines.len(), out.display());
        }
        None => lines.iter().for_each(|l| println!("{l}")),
    }
    Ok(Outcome::Success)
}
