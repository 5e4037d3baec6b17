//! `acpo pmd`: clipped policy mirror descent against Theorems 1-2 and Proposition 1.

use anyhow::bail;

use crate::cli::{print_written, PmdArgs};
use crate::Outcome;

/// `acpo pmd`: clipped policy mirror descent against Theorems 1-2, and Proposition 1.
pub fn run(args: &PmdArgs) -> anyhow::Result<Outcome> {
    let cfg = acpo::pmd::Config {
        seed: args.seed,
        mdps: args.mdps,
        iterations: args.iterations,
        ..Default::default()
    };
    if cfg.mdps == 0 || cfg.iterations == 0 {
        bail!("--mdps and --iterations must be at least 1");
    }
    let report = acpo::pmd::report(&cfg, &args.out)?;
    println!("{}", report.summary());
    print_written(&report.files);
    Ok(Outcome::of(report.all_hold()))
}
