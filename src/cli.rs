//! Command-line interface of the `acpo` binary: clap types and dispatch. Each command parses
//! its flags, makes one library call and prints what it did; the work is in the library.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};

use acpo::data::DataLocation;
use acpo::manifest::{Device, Experiment, Scale};
use acpo::perf::BenchKind;
use acpo::report::Artifact;

use crate::Outcome;

/// Reproduce "Advantage Clipped Policy Optimization" (ACPO): PPO/GRPO versus PPO-AC/GRPO-AC.
#[derive(Debug, Parser)]
#[command(name = "acpo", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate experiment manifests and print one summary line per run.
    ///
    /// Exits 0 when every manifest is valid, 2 (naming the file and field) otherwise.
    Check(CheckArgs),
    /// Train one run (PPO, PPO-AC, GRPO or GRPO-AC) from its manifest.
    Train(TrainArgs),
    /// Sample completions from a model (batched, KV-cached, seeded).
    Generate(GenerateArgs),
    /// Score responses against gold answers with the math verifier.
    Score(ScoreArgs),
    /// Evaluate a model with Avg@k on the manifest's benchmarks.
    Eval(EvalArgs),
    /// Build Table 1, accuracy/entropy curves, r·A tail histograms and speedups from results/.
    Report(ReportArgs),
    /// Run whatever is missing for an artifact (train, eval), then regenerate it.
    Reproduce(ReproduceArgs),
    /// Pack run directories into a compressed archive with a SHA256SUMS manifest.
    Archive(ArchiveArgs),
    /// Check an archive or results directory against its SHA256SUMS (exit 1 on any mismatch).
    Verify(VerifyArgs),
    /// Measure speed and memory, writing a report.
    Bench(BenchArgs),
    /// Clipped policy mirror descent on tabular MDPs against the paper's bounds (Section 4).
    Pmd(PmdArgs),
    /// Model utilities (write a seeded random model in HF layout).
    #[command(subcommand)]
    Model(ModelCommand),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Manifest files or directories (searched recursively for *.yaml).
    #[arg(default_value = "experiments")]
    pub paths: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The run's manifest (YAML).
    pub manifest: PathBuf,
    /// Results root; the run directory is <out>/<scale>/<name>-<fingerprint>.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Continue from the latest complete checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Stop after this many training steps (the manifest's total is unchanged).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Directory with the benchmark and training JSONL files [default: $ACPO_DATA_DIR, else
    /// ~/.cache/acpo/data; a file missing there comes from the HF hub where a faithful copy exists].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub options: acpo::generate::GenerateOptions,
    /// Write completions as JSONL here instead of printing them.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ScoreArgs {
    /// JSONL with at least {"response": ..., "answer": ...} per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Write the scored lines (adding correct, extracted, error) here.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The manifest whose eval section (benchmarks, k, sampling, templates) and model to use.
    pub manifest: PathBuf,
    /// Evaluate this model instead of the manifest's (a directory in HF layout).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Directory with the benchmark JSONL files, checked against their SHA-256 [default:
    /// $ACPO_DATA_DIR, else ~/.cache/acpo/data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Read the benchmarks from the HF hub instead of --data-dir (where a faithful copy exists).
    #[arg(long)]
    pub hub_data: bool,
    /// Run on this device instead of the manifest's.
    #[arg(long, value_enum)]
    pub device: Option<Device>,
    /// Training step this evaluation belongs to (recorded in the summary).
    #[arg(long, default_value_t = 0)]
    pub step: usize,
    /// Where to write samples.jsonl and summary.json.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Which artifact to build.
    #[arg(value_enum)]
    pub artifact: Artifact,
    #[arg(long, value_enum, default_value_t = Scale::Mini)]
    pub scale: Scale,
    /// Results root to read (never written).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Where figures go.
    #[arg(long, default_value = "figures")]
    pub figures: PathBuf,
    /// Put the paper's reported Table 1 beside ours (paper, ours, delta).
    #[arg(long)]
    pub compare_paper: bool,
    /// Also fill this Markdown file's `<!-- begin: NAME -->` … `<!-- end: NAME -->` blocks
    /// with the generated files (table1.md, speedup.md, ...).
    #[arg(long)]
    pub doc: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReproduceArgs {
    #[arg(value_enum)]
    pub artifact: Artifact,
    #[arg(long, value_enum, default_value_t = Scale::Mini)]
    pub scale: Scale,
    /// Regenerate from this results directory or archive (verified first) without training.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Where the manifests are (experiments/<scale>/ is used).
    #[arg(long, default_value = "experiments")]
    pub experiments: PathBuf,
    /// Results root (results/<scale>/ is written).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Directory with the benchmark and training JSONL files, for real-data scales [default:
    /// $ACPO_DATA_DIR, else ~/.cache/acpo/data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Where figures go (figures/<scale>/).
    #[arg(long, default_value = "figures")]
    pub figures: PathBuf,
    /// Also fill this Markdown file's `<!-- begin: NAME -->` … `<!-- end: NAME -->` blocks
    /// with the generated files (table1.md, speedup.md, ...).
    #[arg(long)]
    pub doc: Option<PathBuf>,
    /// Runs trained at once, each on one CPU thread (at mini sizes a second candle thread
    /// slows a run down, a second run side by side doubles throughput). Default: the number
    /// of CPUs when every run is on the CPU, else 1.
    #[arg(long)]
    pub jobs: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ArchiveArgs {
    /// Run directories to pack.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The archive to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Leave the runs' checkpoints out (every table and figure still rebuilds from it).
    #[arg(long)]
    pub no_checkpoints: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// An archive or a directory holding SHA256SUMS.
    pub target: PathBuf,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub kind: BenchKind,
    /// Where to write the report (<kind>.json and <kind>.md).
    #[arg(long, default_value = "results/bench")]
    pub out: PathBuf,
    /// Timed repetitions per model (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Only the tiny model (seconds instead of minutes).
    #[arg(long)]
    pub tiny_only: bool,
    /// The verifier benchmark's data directory [default: $ACPO_DATA_DIR, else ~/.cache/acpo/data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Device of the speed benchmarks (cuda needs the CUDA binary).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: Device,
    /// Dtype of the speed benchmarks (bf16: fp32 masters, bf16 arithmetic).
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: acpo::manifest::DType,
}

#[derive(Debug, Args)]
pub struct PmdArgs {
    /// Where the figure and the Markdown table go.
    #[arg(long, default_value = "figures")]
    pub out: PathBuf,
    /// First random MDP's seed (the others follow).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Random MDPs in the grid.
    #[arg(long, default_value_t = 5)]
    pub mdps: u64,
    /// PMD iterations per run.
    #[arg(long, default_value_t = 100)]
    pub iterations: usize,
}

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write a seeded random model in HF layout (config.json + model.safetensors).
    Init {
        /// An HF config.json describing the architecture.
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also write a character-level tokenizer (printable ASCII; vocab_size must be ≥ 98).
        #[arg(long)]
        char_tokenizer: bool,
        /// Also train and write a byte-level BPE tokenizer on the synthetic task's corpus, up to
        /// the config's vocab_size (≥ 258).
        #[arg(long, conflicts_with = "char_tokenizer")]
        bpe_tokenizer: bool,
    },
    /// Teacher-forced log-probabilities and entropies of token sequences (JSONL `{"ids": [...]}`
    /// per line), one forward pass each: what transformers computes, for parity checks.
    Logprobs {
        /// A model directory in HF layout (config.json + safetensors).
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
        #[arg(long, value_enum, default_value = "cpu")]
        device: Device,
        #[arg(long, value_enum, default_value = "f32")]
        dtype: acpo::manifest::DType,
    },
}

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
                kind => {
                    let target = acpo::perf::Target {
                        device: acpo::model::device(args.device)?,
                        dtype: args.dtype,
                    };
                    acpo::perf::speed(kind, &args.out, args.repeats, args.tiny_only, &target)?
                }
            };
            println!("report: {}", report.display());
            Ok(Outcome::Success)
        }
        Command::Pmd(args) => pmd(&args),
        Command::Model(ModelCommand::Init {
            config,
            out,
            seed,
            char_tokenizer,
            bpe_tokenizer,
        }) => {
            use acpo::manifest::InitTokenizer;
            let kind = match (char_tokenizer, bpe_tokenizer) {
                (true, _) => Some(InitTokenizer::Char),
                (_, true) => Some(InitTokenizer::Bpe),
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
    }
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
    let text = std::fs::read_to_string(&args.manifest)
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
    let model = args.model.clone().map(acpo::manifest::ModelSource::Dir);
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
    let root = match &args.from {
        Some(from) => {
            let found = acpo::reproduce::from_archive(from, &args.results)?;
            println!("{}: {}", from.display(), found.verification.describe());
            match found.root {
                Some(root) => root,
                None => return Ok(Outcome::CheckFailed),
            }
        }
        None => {
            let dir = args.experiments.join(scale);
            let manifests = acpo::manifest::discover(&dir)?;
            if manifests.is_empty() {
                bail!("{}: no manifests for scale {scale}", dir.display());
            }
            let data = data_dir(&args.data_dir);
            acpo::reproduce::train_all(&manifests, &args.results, &data, args.jobs)?;
            args.results.join(scale)
        }
    };
    report(
        args.artifact,
        &root,
        &args.figures,
        args.scale == Scale::Paper,
    )?;
    fill_doc(args.doc.as_deref(), &root)
}

/// `--doc FILE`: the generated files quoted into FILE's marked blocks.
fn fill_doc(doc: Option<&Path>, root: &Path) -> anyhow::Result<Outcome> {
    if let Some(doc) = doc {
        let text = std::fs::read_to_string(doc)
            .with_context(|| format!("cannot read {}", doc.display()))?;
        let (text, blocks) = acpo::report::splice(&text, root)?;
        write_atomic(doc, text.as_bytes())?;
        println!("filled {blocks} generated blocks of {}", doc.display());
    }
    Ok(Outcome::Success)
}
