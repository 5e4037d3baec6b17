//! `acpo eval`: Avg@k of a model on the manifest's benchmarks.

use acpo::data::DataLocation;
use acpo::manifest::Experiment;

use crate::cli::{data_dir, EvalArgs};
use crate::Outcome;

/// `acpo eval`: Avg@k of a model on the manifest's benchmarks.
pub fn run(args: &EvalArgs) -> anyhow::Result<Outcome> {
    let mut exp = Experiment::load(&args.manifest)?;
    exp.device = args.device.map_or(exp.device, Into::into);
    let hub = acpo::hub::HubOptions::from_env();
    let data = match args.hub_data {
        true => DataLocation::Hub(hub.clone()),
        false => data_dir(&args.data_dir),
    };
    let progress = |b: &str, done, total| eprint!("\r{b}: {done}/{total} samples   ");
    let model = args.model.clone().map(acpo::hub::ModelSource::Dir);
    let summary = acpo::eval::evaluate_into(
        &exp,
        model,
        &hub,
        &data,
        args.step,
        args.kv_cache.into(),
        match args.paged_kv {
            true => acpo::rollout::KvLayout::Paged,
            false => exp.kv_layout(),
        },
        &args.out,
        progress,
    )?;
    eprintln!();
    print!("{}", summary.describe());
    println!("wrote {}", args.out.display());
    Ok(Outcome::Success)
}
