//! Command-line interface of the `acpo` binary: the clap types ([`args`]) and the dispatch.
//! Each command parses its flags, makes one library call and prints what it did; the work is in
//! the library.

mod args;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use acpo::data::DataLocation;
use acpo::manifest::{Experiment, Scale};
use acpo::perf::BenchKind;
use acpo::report::Artifact;

pub use args::*;

use crate::Outcome;

/// The data directory of a command: its flag, else the default (`acpo::data::default_dir`).
fn data_dir(flag: &Option<PathBuf>) -> DataLocation {
    DataLocation::Dir(flag.clone().unwrap_or_else(acpo::data::default_dir))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    acpo::atomic::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

fn print_written(files: &[PathBuf]) {
    for f in files {
        println!("wrote {}", f.display());
    }
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Check(args) => {
            let report = acpo::manifest::check_all(&args.paths).context("cannot list manifests")?;
            report.valid.iter().for_each(|l| println!("ok  {l}"));
            report.errors.iter().for_each(|e| eprintln!("invalid  {e}"));
            match (report.files, report.errors.len()) {
                (0, _) => bail!("no manifests (*.yaml) found under {:?}", args.paths),
                (n, 0) => println!("{n} manifests valid"),
                (n, bad) => bail!("{bad} of {n} manifests are invalid (see above)"),
            }
            Ok(Outcome::Success)
        }
        Command::Train(args) => train(&args),
        Command::Doc(args) => doc(&args),
        Command::Generate(args) => generate(&args),
        Command::Score(args) => {
            let scored = acpo::reward::score_file(&args.input)?;
            match &args.output {
                Some(o) => {
                    write_atomic(o, scored.lines.as_bytes())?;
                    println!("{}; wrote {}", scored.summary(), o.display());
                }
                None => {
                    print!("{}", scored.lines);
                    eprintln!("{}", scored.summary());
                }
            }
            Ok(Outcome::Success)
        }
        Command::Eval(args) => eval(&args),
        Command::Report(args) => {
            let root = args.results.join(args.scale.name());
            report(args.artifact, &root, &args.figures, args.compare_paper)?;
            fill_doc(args.doc.as_deref(), &root)
        }
        Command::Reproduce(args) => reproduce(&args),
        Command::Sweep(args) => sweep(&args),
        Command::Archive(args) => {
            let contents = acpo::archive::Contents {
                checkpoints: !args.no_checkpoints,
            };
            let files = acpo::archive::archive(&args.runs, &args.out, contents)?;
            let out = args.out.display();
            println!("wrote {out} ({files} files, SHA256SUMS inside; {out}.sha256 beside it)");
            Ok(Outcome::Success)
        }
        Command::Verify(args) => {
            let report = acpo::archive::verify(&args.target)?;
            println!("{}: {}", args.target.display(), report.describe());
            Ok(Outcome::of(report.ok()))
        }
        Command::Bench(args) => {
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
                    acpo::perf::plan::paper_plan(
                        &args.experiments,
                        &args.configs,
                        measured,
                        &args.out,
                    )?
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
                kind => acpo::perf::speed(kind, &args.out, &speed_options(&args)?)?,
            };
            println!("report: {}", report.display());
            fill_doc(args.doc.as_deref(), &args.out)
        }
        Command::Pmd(args) => pmd(&args),
        Command::Pipeline(args) => {
            let d = acpo::perf::pipeline::Derivation {
                divisor: args.divisor,
                steps: args.steps,
                eval_limit: args.eval_limit,
                tokenizer: args.tokenizer.clone(),
                configs: args.configs.clone(),
                models: args.models.clone(),
                config: args.config.clone(),
                device: args.device,
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
        Command::Model(ModelCommand::Init {
            config,
            out,
            seed,
            char_tokenizer,
            bpe_tokenizer,
            tokenizer_from,
        }) => {
            use acpo::model::init::{InitTokenizer, TokenizerFiles, TokenizerKind};
            let kind = match (char_tokenizer, bpe_tokenizer, tokenizer_from) {
                (true, _, _) => Some(InitTokenizer::Kind(TokenizerKind::Char)),
                (_, true, _) => Some(InitTokenizer::Kind(TokenizerKind::Bpe)),
                (_, _, Some(dir)) => Some(InitTokenizer::Files(TokenizerFiles::Dir { dir })),
                _ => None,
            };
            println!("{}", acpo::model::init::create(&config, &out, seed, kind)?);
            Ok(Outcome::Success)
        }
        Command::Model(ModelCommand::Logprobs {
            model,
            input,
            output,
            device,
            dtype,
        }) => {
            let lines = acpo::model::score::score_file(&model, &input, device, dtype)?;
            write_atomic(&output, lines.as_bytes())?;
            println!(
                "wrote {} scored sequences to {}",
                lines.lines().count(),
                output.display()
            );
            Ok(Outcome::Success)
        }
        Command::Export(cmd) => export(cmd),
        Command::Import(cmd) => import(cmd),
    }
}

/// `acpo import verl`: verl's logs of a run → a run directory.
fn import(cmd: ImportCommand) -> anyhow::Result<Outcome> {
    let ImportCommand::Verl {
        manifest,
        metrics,
        validation_dir,
        out,
    } = cmd;
    let done = acpo::verl::import::import(&manifest, &metrics, &validation_dir, &out)?;
    println!(
        "imported {} steps and {} evaluations ({} samples re-judged) into {}",
        done.steps,
        done.evaluations,
        done.samples,
        done.dir.display()
    );
    if done.non_finite > 0 {
        println!(
            "{} metric values verl logged as NaN or infinite are left out of metrics.jsonl and listed in provenance.json (non_finite_metrics)",
            done.non_finite
        );
    }
    Ok(Outcome::Success)
}

/// `acpo export verl`: the manifest's verl launch and its field-by-field account, and with
/// `--data` the parquet files.
fn export(cmd: ExportCommand) -> anyhow::Result<Outcome> {
    let ExportCommand::Verl {
        manifest,
        out,
        gpus,
        nodes,
        data,
        data_dir: dir,
    } = cmd;
    let target = acpo::verl::Target {
        gpus_per_node: gpus,
        nodes,
    };
    let out = match out {
        Some(out) => out,
        None => {
            let name = Experiment::load(&manifest)?.name;
            Path::new("results/verl").join(name)
        }
    };
    let from = data_dir(&dir);
    let done = acpo::verl::export(&manifest, &out, &target, data.then_some(&from))?;
    for n in &done.unsupported {
        println!("unsupported by verl: {} ({})", n.field, n.why);
    }
    print_written(&[done.script, done.fields]);
    for w in &done.data {
        println!("wrote {} ({} rows)", w.path.display(), w.rows);
    }
    Ok(Outcome::Success)
}

/// `acpo generate`: sample completions and print them (or write JSONL).
fn generate(args: &GenerateArgs) -> anyhow::Result<Outcome> {
    let lines = acpo::generate::generate(&args.options)?;
    match &args.output {
        Some(out) => {
            write_atomic(out, acpo::generate::jsonl(&lines).as_bytes())?;
            println!("wrote {} completions to {}", lines.len(), out.display());
        }
        None => lines.iter().for_each(|l| println!("{l}")),
    }
    Ok(Outcome::Success)
}

/// `acpo train`: one run from its manifest, resumable.
fn train(args: &TrainArgs) -> anyhow::Result<Outcome> {
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
    };
    let mut display = acpo::progress::display(None);
    acpo::train::ensure_model(&experiment, &mut display)?;
    let summary = Trainer::new(&experiment, &text, &opts)?.run(&opts, &mut display)?;
    println!("{}", summary.describe(experiment.trainer.total_steps));
    Ok(Outcome::Success)
}

/// `acpo eval`: Avg@k of a model on the manifest's benchmarks.
fn eval(args: &EvalArgs) -> anyhow::Result<Outcome> {
    let mut exp = Experiment::load(&args.manifest)?;
    exp.device = args.device.unwrap_or(exp.device);
    let hub = acpo::hub::HubOptions::from_env();
    let data = match args.hub_data {
        true => DataLocation::Hub(hub.clone()),
        false => data_dir(&args.data_dir),
    };
    let progress = |b: &str, done, total| eprint!("\r{b}: {done}/{total} samples   ");
    let model = args.model.clone().map(acpo::hub::ModelSource::Dir);
    let summary =
        acpo::eval::evaluate_into(&exp, model, &hub, &data, args.step, &args.out, progress)?;
    eprintln!();
    print!("{}", summary.describe());
    println!("wrote {}", args.out.display());
    Ok(Outcome::Success)
}

/// `acpo pmd`: clipped policy mirror descent against Theorems 1-2, and Proposition 1.
fn pmd(args: &PmdArgs) -> anyhow::Result<Outcome> {
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

/// `acpo report`: the artifact from the run directories in `root`.
fn report(artifact: Artifact, root: &Path, figures: &Path, paper: bool) -> anyhow::Result<()> {
    let (shown, written) = acpo::report::write(artifact, root, figures, paper)?;
    print!("{shown}");
    print_written(&written);
    Ok(())
}

/// `acpo reproduce`: train what is missing at a scale (finished runs are reused, unfinished
/// ones resumed), then build the artifact; or, with --from, verify and rebuild from results.
fn reproduce(args: &ReproduceArgs) -> anyhow::Result<Outcome> {
    let scale = args.scale.name();
    let dir = args.experiments.join(scale);
    let manifests = || -> anyhow::Result<Vec<PathBuf>> {
        let manifests = acpo::manifest::discover(&dir)?;
        if manifests.is_empty() {
            bail!("{}: no manifests for scale {scale}", dir.display());
        }
        Ok(manifests)
    };
    let root = match &args.from {
        Some(from) => {
            let Some(root) = unpack(from, &args.results)? else {
                return Ok(Outcome::CheckFailed);
            };
            // The runs the report stands on, checked before any of it is written (issue #47).
            let manifests = manifests().context(
                "the runs of an archive are checked against the scale's manifests (--experiments DIR)",
            )?;
            let expected = acpo::reproduce::check_finished(&manifests, args.seeds, &root, &dir)?;
            println!("{}: {}", root.display(), expected.describe());
            root
        }
        None => {
            let manifests = acpo::reproduce::select_models(&manifests()?, &args.models)?;
            let data = data_dir(&args.data_dir);
            let seeds = args.seeds.unwrap_or(1);
            acpo::reproduce::train_all(&manifests, seeds, &args.results, &data, args.jobs)?;
            args.results.join(scale)
        }
    };
    report(
        args.artifact,
        &root,
        &args.figures,
        args.scale == Scale::Paper,
    )?;
    reseal(args.from.as_deref(), &root)?;
    fill_doc(args.doc.as_deref(), &root)
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

fn sweep(args: &args::SweepArgs) -> anyhow::Result<Outcome> {
    let sweeps = acpo::sweep::load_all(&args.specs)?;
    let data = data_dir(&args.data_dir);
    let unpacked = match &args.from {
        Some(from) => match unpack(from, &args.results)? {
            Some(root) => Some(root),
            None => return Ok(Outcome::CheckFailed),
        },
        None => None,
    };
    let source = match &unpacked {
        Some(root) => acpo::sweep::Source::Finished(root),
        None => acpo::sweep::Source::Train {
            data: &data,
            jobs: args.jobs,
        },
    };
    let compare = args.compare.as_deref().map(|name| acpo::sweep::Compare {
        name,
        figures: &args.figures,
    });
    let (reports, written) = acpo::sweep::run(&sweeps, source, &args.results, compare)?;
    if let Some(root) = &unpacked {
        reseal(args.from.as_deref(), root)?;
    }
    for w in written {
        println!("wrote {}", w.display());
    }
    println!("sweep reports under {}", reports.display());
    fill_doc(args.doc.as_deref(), &reports)
}

/// `--from ARCHIVE`: verifies it (saying what it found) and unpacks it under `results`; the
/// finished runs' directory, or None when the verification failed.
fn unpack(from: &Path, results: &Path) -> anyhow::Result<Option<PathBuf>> {
    let found = acpo::reproduce::from_archive(from, results)?;
    println!("{}: {}", from.display(), found.verification.describe());
    Ok(found.root)
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

/// `acpo doc`: documents filled from a folder, or (`--check`) told whether they are current.
fn doc(args: &args::DocArgs) -> anyhow::Result<Outcome> {
    let filled = acpo::report::doc::fill(&args.docs, &args.from, args.check)?;
    let mut stale = Vec::new();
    for f in &filled {
        match (args.check, f.changed) {
            (true, true) => stale.push(f.doc.display().to_string()),
            (true, false) => println!("{}: {} generated blocks current", f.doc.display(), f.blocks),
            (false, _) => println!(
                "filled {} generated blocks of {}",
                f.blocks,
                f.doc.display()
            ),
        }
    }
    if !stale.is_empty() {
        eprintln!(
            "generated blocks out of date (rerun without --check): {}",
            stale.join(", ")
        );
    }
    Ok(Outcome::of(stale.is_empty()))
}

/// The speed benchmarks' options from the command line; the train-step shape keeps the
/// built-in defaults where a flag is absent.
fn speed_options(args: &args::BenchArgs) -> anyhow::Result<acpo::perf::SpeedOptions> {
    let device = acpo::model::device(args.device)?;
    let defaults = acpo::perf::StepShape::default();
    let micro_batch = args.micro_batch.unwrap_or(defaults.micro_batch);
    let kernels = (args.attention.is_some() || args.vocab_chunk.is_some()).then(|| {
        let default = acpo::model::qwen::Kernels::for_device(&device);
        acpo::model::qwen::Kernels {
            flash_attention: args
                .attention
                .map_or(default.flash_attention, |a| a == args::AttentionKind::Flash),
            vocab_chunk: args
                .vocab_chunk
                .map_or(default.vocab_chunk, |c| (c > 0).then_some(c)),
        }
    });
    Ok(acpo::perf::SpeedOptions {
        repeats: args.repeats,
        tiny_only: args.tiny_only,
        target: acpo::perf::Target {
            device,
            dtype: args.dtype,
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
            long_tail: args.long_tail,
        },
    })
}
