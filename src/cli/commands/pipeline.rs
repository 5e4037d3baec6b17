//! `acpo pipeline`: paper runs at their own shapes on random weights (issue #34).

use crate::cli::{data_dir, PipelineArgs};
use crate::Outcome;

/// `acpo pipeline`: the derived runs trained (or only reported), then their phases and the paper runs' cost.
pub fn run(args: &PipelineArgs) -> anyhow::Result<Outcome> {
    let d = acpo::perf::pipeline::Derivation {
        divisor: args.divisor,
        steps: args.steps,
        eval_limit: args.eval_limit,
        tokenizer: args.tokenizer.clone(),
        configs: args.configs.clone(),
        models: args.models.clone(),
        config: args.config.clone(),
        device: args.device.map(Into::into),
        kv_layout: args.paged_kv.then_some(acpo::rollout::KvLayout::Paged),
        layer_backward: args
            .layer_by_hand
            .then_some(acpo::model::spec::LayerBackward::ByHand),
        micro_batch: args.micro_batch,
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.results.join("pipeline"));
    let report = acpo::perf::pipeline::run(
        &args.manifests,
        &d,
        &args.results,
        &data_dir(&args.data_dir),
        &args.paper,
        &out,
        args.report_only,
    )?;
    println!("report: {}", report.display());
    Ok(Outcome::Success)
}
