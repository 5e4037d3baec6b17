//! `acpo bench`: a benchmark's report (the verifier, the memory and paper plans, the memory
//! prediction from CPU traces, the speed benchmarks) and the doc blocks quoting it.

use anyhow::bail;

use acpo::perf::SpeedKind;

use crate::cli::args::BenchKind;
use crate::cli::{args, data_dir, fill_doc, BenchArgs};
use crate::Outcome;

/// `acpo bench KIND`: runs it, writes its report, fills `--doc`.
pub fn run(args: &BenchArgs) -> anyhow::Result<Outcome> {
    let report = match args.kind {
        BenchKind::Verifier => {
            acpo::perf::verifier::bench(&data_dir(&args.data_dir), &args.out, args.repeats)?
        }
        BenchKind::MemoryPlan => {
            acpo::perf::memory_plan(&args.experiments, &args.configs, &args.out)?
        }
        BenchKind::PaperPlan => {
            let Some(measured) = &args.measured else {
                bail!("bench paper-plan needs --measured DIR (train-step.json and generate.json measured on CUDA in bf16)");
            };
            acpo::perf::plan::paper_plan(&args.experiments, &args.configs, measured, &args.out)?
        }
        BenchKind::MemoryPredict => {
            let Some(measured) = &args.measured else {
                bail!("bench memory-predict needs --measured DIR (the CPU traces, each in DIR/*/train-step.json)");
            };
            let target = args
                .config
                .clone()
                .unwrap_or_else(|| args.configs.join("qwen3-1.7b.json"));
            acpo::perf::predict::memory_predict(measured, &target, &args.out)?
        }
        BenchKind::Generate => speed(SpeedKind::Generate, args)?,
        BenchKind::TrainStep => speed(SpeedKind::TrainStep, args)?,
        BenchKind::Attention => speed(SpeedKind::Attention, args)?,
        BenchKind::DecodePredict => {
            let Some(measured) = &args.measured else {
                bail!("bench decode-predict needs --measured DIR (the GPU runs, results/gpu)");
            };
            let target = args
                .config
                .clone()
                .unwrap_or_else(|| args.configs.join("qwen3-1.7b.json"));
            acpo::perf::decode_predict(measured, &target, &args.out)?
        }
        BenchKind::KernelsLoad => {
            let device = acpo::model::device(args.device.into())?;
            acpo::perf::kernels_load::kernels_load(&device, &args.out)?
        }
        BenchKind::AttentionPredict => {
            let Some(measured) = &args.measured else {
                bail!("bench attention-predict needs --measured DIR (the GPU runs, results/gpu)");
            };
            let target = args
                .config
                .clone()
                .unwrap_or_else(|| args.configs.join("qwen3-1.7b.json"));
            acpo::perf::flash_predict::attention_predict(measured, &target, &args.out)?
        }
    };
    println!("report: {}", report.display());
    fill_doc(args.doc.as_deref(), &args.out)
}

/// The speed benchmark `kind` with the command line's options.
fn speed(kind: SpeedKind, args: &BenchArgs) -> anyhow::Result<std::path::PathBuf> {
    Ok(acpo::perf::speed(kind, &args.out, &speed_options(args)?)?)
}

/// The speed benchmarks' options from the command line; the train-step shape keeps the
/// built-in defaults where a flag is absent.
fn speed_options(args: &args::BenchArgs) -> anyhow::Result<acpo::perf::SpeedOptions> {
    let device = acpo::model::device(args.device.into())?;
    let defaults = acpo::perf::StepShape::default();
    let micro_batch = args.micro_batch.unwrap_or(defaults.micro_batch);
    let kernels = (args.attention.is_some()
        || args.vocab_chunk.is_some()
        || args.layer_by_hand
        || args.flash_backward.is_some())
    .then(|| {
        let default = acpo::model::qwen::Kernels::for_device(&device);
        acpo::model::qwen::Kernels {
            flash_attention: args
                .attention
                .map_or(default.flash_attention, |a| a == args::AttentionKind::Flash),
            vocab_chunk: args
                .vocab_chunk
                .map_or(default.vocab_chunk, |c| (c > 0).then_some(c)),
            decode_chain: default.decode_chain,
            layer_by_hand: args.layer_by_hand,
            flash_backward: args
                .flash_backward
                .map_or(default.flash_backward, Into::into),
        }
    });
    Ok(acpo::perf::SpeedOptions {
        repeats: args.repeats,
        tiny_only: args.tiny_only,
        target: acpo::perf::Target {
            device,
            dtype: args.dtype.into(),
        },
        config: args.config.clone(),
        step: acpo::perf::StepShape {
            seq_len: args.seq_len.unwrap_or(defaults.seq_len),
            prompt_len: args.prompt_len.unwrap_or(defaults.prompt_len),
            batch: args.batch.unwrap_or(if args.micro_batch.is_some() {
                micro_batch
            } else {
                defaults.batch
            }),
            micro_batch,
            kernels,
            checkpointing: args.checkpointing,
            trace: args.trace,
        },
        sample: acpo::perf::SampleShape {
            batch: args.batch.unwrap_or(acpo::perf::BATCH),
            prompt_len: args.prompt_len.unwrap_or(acpo::perf::PROMPT_LEN),
            new_tokens: args.new_tokens.unwrap_or(acpo::perf::NEW_TOKENS),
            max_batch: args.max_batch,
            group: args.group.unwrap_or(1),
            long_tail: args.long_tail,
            paged: args.paged_kv,
            paged_only: args.paged_only,
            kv_cache: args.kv_cache.into(),
        },
    })
}
