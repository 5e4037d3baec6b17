//! `acpo train`: one run from its manifest, resumable.

use anyhow::{bail, Context};

use acpo::manifest::Experiment;

use crate::cli::{data_dir, TrainArgs};
use crate::Outcome;

/// `acpo train`: one run from its manifest, resumable.
pub fn run(args: &TrainArgs) -> anyhow::Result<Outcome> {
    use acpo::train::{TrainOptions, Trainer};
    let experiment = Experiment::load(&args.manifest)?;
    if let Err(reason) = experiment.check_model_config() {
        bail!("{}: {reason}", args.manifest.display());
    }
    let text = acpo::files::read_to_string(&args.manifest)
        .with_context(|| format!("cannot read {}", args.manifest.display()))?;
    if args.max_steps == Some(0) {
        bail!("--max-steps must be at least 1");
    }
    let opts = TrainOptions {
        out_root: args.out.clone(),
        resume: args.resume,
        max_steps: args.max_steps,
        data: data_dir(&args.data_dir),
        hub: acpo::hub::HubOptions::from_env(),
        start_evals: None,
    };
    let mut display = acpo::progress::display(None);
    acpo::train::ensure_model(&experiment, &mut display)?;
    let summary = Trainer::new(&experiment, &text, &opts)?.run(&opts, &mut display)?;
    println!("{}", summary.describe(experiment.trainer.total_steps));
    Ok(Outcome::Success)
}
