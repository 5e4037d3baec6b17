//! Command-line interface of the `acpo` binary (flags and dispatch; the work is in the library).
//!
//! Every subcommand the project will have is declared here with its real flags, so `--help` is
//! the manual from day one. A subcommand whose capability has not landed yet says so, names the
//! issue that brings it, and exits 2: it never pretends to have done something.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};

use acpo::manifest::{self, Experiment};

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
    /// Directory with the benchmark and training JSONL files.
    #[arg(long, default_value = "../shared/data")]
    pub data_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A local model directory in HF layout, or a hub repo id (owner/name).
    #[arg(long)]
    pub model: String,
    /// Hub revision (branch, tag or commit) when --model is a repo id.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// One prompt text.
    #[arg(long, conflicts_with = "input", required_unless_present = "input")]
    pub prompt: Option<String>,
    /// A JSONL file of prompts ({"prompt": ...} per line).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Write completions as JSONL here instead of printing them.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Completions per prompt.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    pub chat: bool,
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
    /// Directory with the benchmark JSONL files (checked against their SHA-256).
    #[arg(long, default_value = "../shared/data")]
    pub data_dir: PathBuf,
    /// Read the benchmarks from the HF hub instead of --data-dir (where a faithful copy exists).
    #[arg(long)]
    pub hub_data: bool,
    /// Training step this evaluation belongs to (recorded in the summary).
    #[arg(long, default_value_t = 0)]
    pub step: usize,
    /// Where to write samples.jsonl and summary.json.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Artifact {
    Table1,
    Accuracy,
    Entropy,
    Tails,
    Speedup,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScaleArg {
    Smoke,
    Mini,
    Paper,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Which artifact to build.
    #[arg(value_enum)]
    pub artifact: Artifact,
    #[arg(long, value_enum, default_value_t = ScaleArg::Mini)]
    pub scale: ScaleArg,
    /// Results root to read (never written).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Where figures go.
    #[arg(long, default_value = "figures")]
    pub figures: PathBuf,
    /// Put the paper's reported Table 1 beside ours (paper, ours, delta).
    #[arg(long)]
    pub compare_paper: bool,
}

#[derive(Debug, Args)]
pub struct ReproduceArgs {
    #[arg(value_enum)]
    pub artifact: Artifact,
    #[arg(long, value_enum, default_value_t = ScaleArg::Mini)]
    pub scale: ScaleArg,
    /// Regenerate from this results directory or archive (verified first) without training.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Where the manifests are (experiments/<scale>/ is used).
    #[arg(long, default_value = "experiments")]
    pub experiments: PathBuf,
    /// Results root (results/<scale>/ is written).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Directory with the benchmark and training JSONL files (real-data scales).
    #[arg(long, default_value = "../shared/data")]
    pub data_dir: PathBuf,
    /// Where figures go (figures/<scale>/).
    #[arg(long, default_value = "figures")]
    pub figures: PathBuf,
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
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// An archive or a directory holding SHA256SUMS.
    pub target: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchKind {
    /// Sampling throughput (tokens/s).
    Generate,
    /// One RL training step (tokens/s, peak memory).
    TrainStep,
    /// Verifier throughput (answers/s).
    Verifier,
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
}

/// How a successful invocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything asked for was done and every check passed.
    Success,
    /// The command ran, and a check it performs failed (exit 1).
    CheckFailed,
}

impl Outcome {
    pub fn exit_code(self) -> ExitCode {
        match self {
            Outcome::Success => ExitCode::SUCCESS,
            Outcome::CheckFailed => ExitCode::from(1),
        }
    }
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Check(args) => check(&args),
        Command::Train(args) => train(&args),
        Command::Generate(args) => generate(&args),
        Command::Score(args) => score(&args),
        Command::Eval(args) => eval(&args),
        Command::Report(args) => report(&args),
        Command::Reproduce(args) => reproduce(&args),
        Command::Archive(args) => {
            let files = acpo::archive::archive(&args.runs, &args.out)?;
            println!(
                "wrote {} ({} files, SHA256SUMS inside; {}.sha256 beside it)",
                args.out.display(),
                files,
                args.out.display()
            );
            Ok(Outcome::Success)
        }
        Command::Verify(args) => {
            let report = acpo::archive::verify(&args.target)?;
            println!("{}: {}", args.target.display(), report.describe());
            Ok(if report.ok() {
                Outcome::Success
            } else {
                Outcome::CheckFailed
            })
        }
        Command::Bench(args) => bench(&args),
        Command::Pmd(args) => pmd(&args),
        Command::Model(ModelCommand::Init {
            config,
            out,
            seed,
            char_tokenizer,
            bpe_tokenizer,
        }) => {
            use acpo::manifest::InitTokenizer;
            use acpo::model::init;
            let tokenizer = match (char_tokenizer, bpe_tokenizer) {
                (true, _) => Some(InitTokenizer::Char),
                (_, true) => Some(InitTokenizer::Bpe),
                _ => None,
            };
            let vocab_size = acpo::model::QwenConfig::load(&config)?.vocab_size;
            // Refuse a tokenizer the model cannot hold before writing anything.
            if let Some(kind) = tokenizer {
                init::check_tokenizer_fits(kind, vocab_size, &config)?;
            }
            let params = init::write_random_model(&config, &out, seed)?;
            if let Some(kind) = tokenizer {
                let size = init::write_tokenizer(kind, &out, vocab_size, &config)?;
                let name = format!("{kind:?}").to_lowercase();
                println!("wrote a {name} tokenizer with {size} tokens");
            }
            println!(
                "wrote a random model ({} tensors, {} parameters, seed {seed}) to {}",
                params.len(),
                params.count(),
                out.display()
            );
            Ok(Outcome::Success)
        }
    }
}

/// `acpo generate`: sample completions and print them (or write JSONL).
fn generate(args: &GenerateArgs) -> anyhow::Result<Outcome> {
    use acpo::model::{
        hub,
        qwen::Qwen,
        tokenizer::{Message, Tokenizer},
        Params, QwenConfig,
    };
    use acpo::rollout::{self, SamplingParams, StopCriteria};
    use std::io::Write;

    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--top-p must be in (0, 1], got {}", args.top_p);
    }
    if args.temperature.is_nan() || args.temperature < 0.0 {
        bail!(
            "--temperature must be >= 0 (0 = greedy), got {}",
            args.temperature
        );
    }
    if args.n == 0 || args.top_k == Some(0) {
        bail!("--n and --top-k must be at least 1");
    }
    let source = if std::path::Path::new(&args.model).exists() {
        acpo::manifest::ModelSource::Dir(PathBuf::from(&args.model))
    } else if args.model.matches('/').count() == 1 {
        acpo::manifest::ModelSource::Hub {
            repo: args.model.clone(),
            revision: args.revision.clone(),
        }
    } else {
        bail!(
            "--model {}: no such directory, and not a hub id (owner/name)",
            args.model
        );
    };
    let dir = hub::resolve(&source, &hub::HubOptions::from_env())?;
    let cfg = QwenConfig::load(&dir.join("config.json"))?;
    let device = candle_core::Device::Cpu;
    let params = Params::load_dir(&dir, candle_core::DType::F32, &device)?;
    let model = Qwen::new(&cfg, &params, true)?;
    let tokenizer = Tokenizer::load(&dir)?;

    let prompts: Vec<String> = match (&args.prompt, &args.input) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(path)) => read_prompts(path)?,
        (None, None) => bail!("give --prompt TEXT or --input FILE"),
    };
    let mut encoded = Vec::new();
    for p in &prompts {
        let text = if args.chat {
            tokenizer.apply_chat_template(&[Message::user(p.as_str())], true)?
        } else {
            p.clone()
        };
        let ids = tokenizer.encode(&text)?;
        if ids.is_empty() {
            bail!("a prompt encodes to no tokens");
        }
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            bail!("token id {bad} is outside the model's vocabulary ({}): tokenizer and model do not match", cfg.vocab_size);
        }
        encoded.push(ids);
    }
    let mut batch = Vec::new();
    let mut keys = Vec::new();
    let mut index = Vec::new();
    for (pi, ids) in encoded.iter().enumerate() {
        for si in 0..args.n {
            batch.push(ids.clone());
            keys.push([args.seed, 0, pi as u64, si as u64]);
            index.push((pi, si));
        }
    }
    let mut eos = cfg.eos_token_ids();
    eos.extend(tokenizer.eos_id());
    let decode = |ids: &[u32]| tokenizer.decode(ids, false).unwrap_or_default();
    let stop = StopCriteria {
        eos_ids: eos,
        stop_strings: Vec::new(),
        decode: Some(&decode),
    };
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        max_new_tokens: args.max_new_tokens,
    };
    let completions = rollout::generate(&model, &batch, &keys, &params, &stop, tokenizer.pad_id())?;
    let mut lines = Vec::new();
    for ((pi, si), c) in index.iter().zip(&completions) {
        let text = tokenizer.decode(&c.tokens, true)?;
        lines.push(serde_json::json!({
            "prompt_index": pi, "sample_index": si, "prompt": prompts[*pi],
            "completion": text, "finish_reason": c.finish, "num_tokens": c.tokens.len(),
        }));
        if args.output.is_none() {
            println!(
                "--- prompt {pi}, sample {si} ({:?}, {} tokens)\n{text}",
                c.finish,
                c.tokens.len()
            );
        }
    }
    if let Some(out) = &args.output {
        let mut body = Vec::new();
        for l in &lines {
            writeln!(body, "{l}")?;
        }
        write_atomic(out, &body)?;
        println!("wrote {} completions to {}", lines.len(), out.display());
    }
    Ok(Outcome::Success)
}

/// `acpo bench`: measure, print and write a report.
fn bench(args: &BenchArgs) -> anyhow::Result<Outcome> {
    use acpo::speed;
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let (name, run): (&str, speed::BenchFn) = match args.kind {
        BenchKind::Generate => ("generate", speed::bench_generate),
        BenchKind::TrainStep => ("train-step", speed::bench_train_step),
        BenchKind::Verifier => return bench_verifier(args),
    };
    let mut rows = Vec::new();
    for m in speed::MODELS.iter().take(if args.tiny_only {
        1
    } else {
        speed::MODELS.len()
    }) {
        let r = run(m, args.repeats)?;
        println!(
            "{:<12} {:>11} params  {:<10} {:>8.1} tokens/s  ({:.3} s for {} tokens)",
            r.model, r.parameters, r.what, r.tokens_per_second, r.seconds, r.tokens
        );
        rows.push(r);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let json = serde_json::to_string_pretty(&rows)?;
    for (file, body) in [
        (format!("{name}.json"), json),
        (
            format!("{name}.md"),
            speed::markdown(&format!("acpo bench {name}"), &rows),
        ),
    ] {
        write_atomic(&args.out.join(&file), body.as_bytes())?;
    }
    println!("report: {}", args.out.join(format!("{name}.md")).display());
    Ok(Outcome::Success)
}

/// Writes `bytes` to `path` atomically (temp file + rename).
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    acpo::atomic::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// `acpo train`: one run from its manifest, resumable.
fn train(args: &TrainArgs) -> anyhow::Result<Outcome> {
    use acpo::train::{TrainOptions, Trainer};
    let experiment = acpo::manifest::Experiment::load(&args.manifest)?;
    let text = std::fs::read_to_string(&args.manifest)
        .with_context(|| format!("cannot read {}", args.manifest.display()))?;
    if args.max_steps == Some(0) {
        bail!("--max-steps must be at least 1");
    }
    let opts = TrainOptions {
        out_root: args.out.clone(),
        resume: args.resume,
        max_steps: args.max_steps,
        data: acpo::bench::DataLocation::Dir(args.data_dir.clone()),
        hub: acpo::model::hub::HubOptions::from_env(),
    };
    let mut display = progress_display(None);
    acpo::train::ensure_model(&experiment, &mut display)?;
    let mut trainer = Trainer::new(&experiment, &text, &opts)?;
    let summary = trainer.run(&opts, &mut display)?;
    match summary.resumed_from {
        Some(s) => println!(
            "resumed from step {s}; now at step {} of {}; run directory {}",
            summary.steps_done,
            experiment.trainer.total_steps,
            summary.dir.display()
        ),
        None => println!(
            "trained {} of {} steps; run directory {}",
            summary.steps_done,
            experiment.trainer.total_steps,
            summary.dir.display()
        ),
    }
    Ok(Outcome::Success)
}

/// Progress of a training run: an indicatif bar with ETA on a terminal, one line per event
/// otherwise (logs, CI).
fn progress_display(prefix: Option<String>) -> impl FnMut(acpo::train::Event<'_>) {
    use acpo::train::{step_line, Event};
    use std::io::IsTerminal;
    // Runs side by side print prefixed lines (bars would overwrite each other).
    let tty = prefix.is_none() && std::io::stderr().is_terminal();
    let p = prefix.map_or(String::new(), |p| format!("[{p}] "));
    let mut bar: Option<indicatif::ProgressBar> = None;
    move |event| match event {
        Event::Start { step, total } => {
            if tty {
                let b = indicatif::ProgressBar::new(total as u64);
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{bar:30} step {pos}/{len}  {elapsed} < {eta}  {msg}",
                ) {
                    b.set_style(style);
                }
                b.set_position(step as u64);
                bar = Some(b);
            } else {
                eprintln!("{p}training from step {step} of {total}");
            }
        }
        Event::Step {
            step,
            total,
            metrics,
        } => match &bar {
            Some(b) => {
                b.set_position(step as u64);
                b.set_message(format!(
                    "acc {:.3}  entropy {:.3}",
                    metrics.get("reward/acc/mean").copied().unwrap_or(f64::NAN),
                    metrics.get("actor/entropy").copied().unwrap_or(f64::NAN)
                ));
            }
            None => eprintln!("{p}{}", step_line(step, total, metrics)),
        },
        Event::Eval {
            step,
            weighted_accuracy,
        } => {
            let line = format!(
                "eval at step {step}: weighted accuracy {:.2} %",
                100.0 * weighted_accuracy
            );
            match &bar {
                Some(b) => b.println(line),
                None => eprintln!("{p}{line}"),
            }
        }
        Event::WarmStart { step, total, loss } => {
            if tty {
                let b = bar.get_or_insert_with(|| {
                    let b = indicatif::ProgressBar::new(total as u64);
                    if let Ok(style) = indicatif::ProgressStyle::with_template(
                        "{bar:30} warm start {pos}/{len}  {elapsed} < {eta}  {msg}",
                    ) {
                        b.set_style(style);
                    }
                    b
                });
                b.set_position(step as u64);
                b.set_message(format!("loss {loss:.3}"));
                if step == total {
                    b.finish_and_clear();
                    bar = None;
                }
            } else if step == 1 || step.is_multiple_of(50) || step == total {
                eprintln!("{p}warm start {step}/{total}: loss {loss:.4}");
            }
        }
    }
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
    let held = report.rows.iter().filter(|r| r.holds && r.monotone).count();
    println!(
        "{} of {} runs stay under their theorem bound with monotone F_N; Proposition 1 holds for {} of {} clip ranges",
        held,
        report.rows.len(),
        report
            .prop1
            .iter()
            .filter(|p| p.second_moment_acpo <= p.second_moment_ppo)
            .count(),
        report.prop1.len()
    );
    for f in &report.files {
        println!("wrote {}", f.display());
    }
    Ok(if report.all_hold() {
        Outcome::Success
    } else {
        Outcome::CheckFailed
    })
}

/// `acpo report`: Table 1 and the step speedups from `results/<scale>/` (figures: not yet).
fn report(args: &ReportArgs) -> anyhow::Result<Outcome> {
    report_at(args, &args.results.join(scale_name(args.scale)))
}

/// The report over the run directories in `root`.
fn report_at(args: &ReportArgs, root: &std::path::Path) -> anyhow::Result<Outcome> {
    use acpo::report;
    let root = root.to_path_buf();
    let a = args.artifact;
    let all = a == Artifact::All;
    let (table, speedup) = (all || a == Artifact::Table1, all || a == Artifact::Speedup);
    let runs = report::load_results(&root)?;
    if runs.is_empty() {
        bail!(
            "{}: no run directories with eval.jsonl (train first: acpo train MANIFEST)",
            root.display()
        );
    }
    if table {
        let groups = report::table1(&runs);
        write_atomic(
            &root.join("table1.md"),
            report::markdown(&groups).as_bytes(),
        )?;
        write_atomic(&root.join("table1.tex"), report::latex(&groups).as_bytes())?;
        write_atomic(&root.join("table1.csv"), report::csv(&groups).as_bytes())?;
        print!("{}", report::markdown(&groups));
        if args.compare_paper {
            let paper_path = PathBuf::from("../shared/paper/table1.csv");
            let paper = std::fs::read_to_string(&paper_path)
                .with_context(|| format!("cannot read {}", paper_path.display()))?;
            write_atomic(
                &root.join("table1_vs_paper.md"),
                report::compare_paper(&groups, &paper).as_bytes(),
            )?;
        }
        println!("wrote {}/table1.{{md,tex,csv}}", root.display());
    }
    if speedup {
        let pairs = report::speedups(&runs);
        let md = report::speedup_markdown(&pairs);
        write_atomic(&root.join("speedup.md"), md.as_bytes())?;
        print!("{md}");
        println!("wrote {}", root.join("speedup.md").display());
    }
    let scale = root
        .file_name()
        .map_or("results".into(), |n| n.to_string_lossy().to_string());
    let figures = args.figures.join(scale);
    let mut written = Vec::new();
    if all || a == Artifact::Accuracy {
        written.extend(report::figures::accuracy(&runs, &figures)?);
    }
    if all || a == Artifact::Entropy {
        written.extend(report::figures::entropy(&runs, &figures)?);
    }
    if all || a == Artifact::Tails {
        let t = report::figures::tails(&runs, &figures)?;
        if t.is_empty() && a == Artifact::Tails {
            bail!(
                "{}: no run has tails/ (set trainer.tails_every > 0)",
                root.display()
            );
        }
        written.extend(t);
    }
    for f in &written {
        println!("wrote {}", f.display());
    }
    Ok(Outcome::Success)
}

fn scale_name(s: ScaleArg) -> &'static str {
    match s {
        ScaleArg::Smoke => "smoke",
        ScaleArg::Mini => "mini",
        ScaleArg::Paper => "paper",
    }
}

/// `acpo reproduce`: train what is missing at a scale (finished runs are reused, unfinished
/// ones resumed), then build the artifact; or, with --from, verify and rebuild from results.
fn reproduce(args: &ReproduceArgs) -> anyhow::Result<Outcome> {
    let scale = scale_name(args.scale);
    let results_root = match &args.from {
        Some(from) => {
            let report = acpo::archive::verify(from)?;
            println!("{}: {}", from.display(), report.describe());
            if !report.ok() {
                return Ok(Outcome::CheckFailed);
            }
            // An archive holds run directories at its top; unpack it next to the results.
            let root = if from.is_dir() {
                from.clone()
            } else {
                let dest = args.results.join(format!(
                    "from-{}",
                    from.file_stem()
                        .map_or("archive".into(), |s| s.to_string_lossy().to_string())
                ));
                std::fs::create_dir_all(&dest)
                    .with_context(|| format!("cannot create {}", dest.display()))?;
                acpo::archive::unpack(from, &dest).map_err(anyhow::Error::msg)?;
                dest
            };
            root
        }
        None => {
            let manifests = acpo::manifest::discover(&args.experiments.join(scale))?;
            if manifests.is_empty() {
                bail!(
                    "{}: no manifests for scale {scale}",
                    args.experiments.join(scale).display()
                );
            }
            train_all(args, &manifests)?;
            args.results.join(scale)
        }
    };
    let report_args = ReportArgs {
        artifact: args.artifact,
        scale: args.scale,
        results: results_root.parent().map(PathBuf::from).unwrap_or_default(),
        figures: args.figures.clone(),
        compare_paper: args.scale == ScaleArg::Paper,
    };
    // The report reads <results>/<scale>; --from points at the scale root itself.
    if args.from.is_some() {
        return report_at(&report_args, &results_root);
    }
    report(&report_args)
}

/// Trains every run of `manifests` that is not finished: first the distinct created models
/// (warm starts), then the runs, `--jobs` at a time. Finished runs are reused, unfinished ones
/// resumed; the first error stops the queue (running jobs finish their run) and is returned.
fn train_all(args: &ReproduceArgs, manifests: &[PathBuf]) -> anyhow::Result<()> {
    use acpo::train::{latest_checkpoint, run_dir, TrainOptions, Trainer};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    let mut exps = Vec::new();
    for path in manifests {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        exps.push((acpo::manifest::Experiment::load(path)?, text));
    }
    let all_cpu = exps
        .iter()
        .all(|(e, _)| e.device == acpo::manifest::Device::Cpu);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = match args.jobs {
        Some(0) => bail!("--jobs must be at least 1"),
        Some(j) => j,
        None if all_cpu => cpus,
        None => 1,
    };
    if jobs > 1 && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // Read by rayon and candle when their pools start (not yet: nothing ran a kernel).
        std::env::set_var("CANDLE_NUM_THREADS", "1");
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let started = std::time::Instant::now();
    let total = exps.len();
    // Unfinished runs with the step of their last checkpoint (None: not started).
    let mut pending: Vec<(usize, Option<usize>)> = Vec::new();
    for (i, (exp, _)) in exps.iter().enumerate() {
        let done = latest_checkpoint(&run_dir(exp, &args.results))?.map(|c| c.0);
        if done == Some(exp.trainer.total_steps) {
            println!("[{}/{total}] {}: finished earlier, reused", i + 1, exp.name);
        } else {
            pending.push((i, done));
        }
    }
    // Phase 1: each created model once (several runs share one), in parallel.
    let mut models: Vec<usize> = Vec::new();
    for &(i, _) in &pending {
        let src = &exps[i].0.model;
        if src.init.is_some() && !models.iter().any(|&j| exps[j].0.model.source == src.source) {
            models.push(i);
        }
    }
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    // Runs f(0), …, f(n − 1) on `jobs` threads, each taking the next index when free.
    let queue = |n: usize, f: &(dyn Fn(usize) -> anyhow::Result<()> + Sync)| {
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..jobs.min(n) {
                scope.spawn(|| loop {
                    if failed.load(Ordering::SeqCst) {
                        return;
                    }
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    if k >= n {
                        return;
                    }
                    if let Err(e) = f(k) {
                        failed.store(true, Ordering::SeqCst);
                        first_error.lock().expect("lock").get_or_insert(e);
                        return;
                    }
                });
            }
        });
    };
    let parallel = jobs > 1;
    queue(models.len(), &|k| {
        let (exp, _) = &exps[models[k]];
        let mut display = progress_display(parallel.then(|| exp.name.clone()));
        acpo::train::ensure_model(exp, &mut display)?;
        Ok(())
    });
    if let Some(e) = first_error.lock().expect("lock").take() {
        return Err(e);
    }
    if !models.is_empty() {
        println!(
            "models ready ({} created or checked) after {:.1} min",
            models.len(),
            started.elapsed().as_secs_f64() / 60.0
        );
    }
    // Phase 2: the runs.
    let finished = AtomicUsize::new(0);
    let runs_started = std::time::Instant::now();
    queue(pending.len(), &|k| {
        let (i, done) = pending[k];
        let (exp, text) = &exps[i];
        println!(
            "[{}/{total}] {}: {}",
            i + 1,
            exp.name,
            if done.is_some() {
                "resuming"
            } else {
                "training"
            }
        );
        let o = TrainOptions {
            out_root: args.results.clone(),
            resume: done.is_some(),
            max_steps: None,
            data: acpo::bench::DataLocation::Dir(args.data_dir.clone()),
            hub: acpo::model::hub::HubOptions::from_env(),
        };
        let mut display = progress_display(parallel.then(|| exp.name.clone()));
        let mut trainer = Trainer::new(exp, text, &o)?;
        trainer.run(&o, &mut display)?;
        let n = finished.fetch_add(1, Ordering::SeqCst) + 1;
        let elapsed = runs_started.elapsed().as_secs_f64();
        println!(
            "[{}/{total}] {} done; {n} of {} runs in {:.1} min, about {:.1} min to go",
            i + 1,
            exp.name,
            pending.len(),
            elapsed / 60.0,
            elapsed / n as f64 * (pending.len() - n) as f64 / 60.0
        );
        Ok(())
    });
    if let Some(e) = first_error.lock().expect("lock").take() {
        return Err(e);
    }
    println!(
        "trained {} runs ({} jobs) in {:.1} min",
        pending.len(),
        jobs,
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}

/// `acpo score`: judge responses made anywhere (vLLM, verl dumps) with the verifier.
fn score(args: &ScoreArgs) -> anyhow::Result<Outcome> {
    let path = &args.input;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = String::new();
    let (mut n, mut correct, mut errors) = (0usize, 0usize, 0usize);
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{}:{}", path.display(), i + 1);
        let mut v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: not a JSON object", at()))?;
        let obj = v
            .as_object_mut()
            .with_context(|| format!("{}: not a JSON object", at()))?;
        let field = |name: &str| -> anyhow::Result<String> {
            match obj.get(name) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(serde_json::Value::Number(x)) if name == "answer" => Ok(x.to_string()),
                _ => bail!("{}: field `{name}` (a string) is missing", at()),
            }
        };
        let (response, answer) = (field("response")?, field("answer")?);
        let verdict = acpo::verify::verify(&answer, &response);
        n += 1;
        correct += usize::from(verdict.correct);
        obj.insert("correct".into(), verdict.correct.into());
        obj.insert("extracted".into(), verdict.extracted.clone().into());
        if let Some(e) = &verdict.error {
            errors += 1;
            obj.insert("error".into(), e.clone().into());
        }
        out.push_str(&serde_json::to_string(&v)?);
        out.push('\n');
    }
    if n == 0 {
        bail!("{}: no responses to score", path.display());
    }
    let summary = format!(
        "scored {n} responses: {correct} correct ({:.2} %), {errors} with a verifier error",
        100.0 * correct as f64 / n as f64
    );
    match &args.output {
        Some(o) => {
            write_atomic(o, out.as_bytes())?;
            println!("{summary}; wrote {}", o.display());
        }
        None => {
            print!("{out}");
            eprintln!("{summary}");
        }
    }
    Ok(Outcome::Success)
}

/// `acpo eval`: Avg@k of a model on the manifest's benchmarks.
fn eval(args: &EvalArgs) -> anyhow::Result<Outcome> {
    use acpo::bench::DataLocation;
    use acpo::model::{hub, qwen::Qwen, tokenizer::Tokenizer, Params, QwenConfig};
    let experiment = acpo::manifest::Experiment::load(&args.manifest)?;
    let source = match &args.model {
        Some(dir) => acpo::manifest::ModelSource::Dir(dir.clone()),
        None => experiment.model.source.clone(),
    };
    let dir = hub::resolve(&source, &hub::HubOptions::from_env())?;
    let cfg = QwenConfig::load(&dir.join("config.json"))?;
    let device = candle_core::Device::Cpu;
    let params = Params::load_dir(
        &dir,
        acpo::model::parse_dtype(experiment.model.dtype),
        &device,
    )?;
    let model = Qwen::new(&cfg, &params, true)?;
    let tokenizer = Tokenizer::load(&dir)?;
    let data = if args.hub_data {
        DataLocation::Hub(hub::HubOptions::from_env())
    } else {
        DataLocation::Dir(args.data_dir.clone())
    };
    let (summary, records) = acpo::eval::evaluate(
        &model,
        &tokenizer,
        &experiment,
        &data,
        args.step,
        |b, done, total| {
            eprint!("\r{b}: {done}/{total} samples   ");
        },
    )?;
    eprintln!();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut lines = String::new();
    for r in &records {
        lines.push_str(&serde_json::to_string(r)?);
        lines.push('\n');
    }
    write_atomic(&args.out.join("samples.jsonl"), lines.as_bytes())?;
    write_atomic(
        &args.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    for b in &summary.benchmarks {
        println!(
            "{:<14} {:>4} problems  avg@{} {:6.2} %",
            b.benchmark,
            b.problems,
            b.k,
            100.0 * b.avg_at_k
        );
    }
    println!(
        "weighted accuracy {:.2} %; wrote {}",
        100.0 * summary.weighted_accuracy,
        args.out.display()
    );
    Ok(Outcome::Success)
}

/// `acpo bench verifier`: answers/s on every benchmark gold × {boxed, Answer: line, wrong}.
fn bench_verifier(args: &BenchArgs) -> anyhow::Result<Outcome> {
    use acpo::bench::{self, DataLocation};
    let data = DataLocation::Dir(PathBuf::from("../shared/data"));
    let mut pairs: Vec<(String, String, bool)> = Vec::new();
    for b in acpo::manifest::Benchmark::ALL {
        for p in bench::load(bench::spec(b), &data)? {
            let g = p.answer;
            pairs.push((
                g.clone(),
                format!("Reasoning.\nSo the answer is \\boxed{{{g}}}."),
                true,
            ));
            pairs.push((g.clone(), format!("Reasoning.\nAnswer: {g}"), true));
            pairs.push((g.clone(), format!("\\boxed{{{g}+1}}"), false));
        }
    }
    let mut best = f64::INFINITY;
    let mut verdicts = Vec::new();
    for _ in 0..args.repeats {
        let t = std::time::Instant::now();
        verdicts = pairs
            .iter()
            .map(|(g, r, _)| acpo::verify::verify(g, r).correct)
            .collect();
        best = best.min(t.elapsed().as_secs_f64());
    }
    let expected_ok = verdicts
        .iter()
        .zip(&pairs)
        .filter(|(v, p)| **v == p.2)
        .count();
    let rate = pairs.len() as f64 / best;
    println!(
        "verifier: {} pairs in {best:.3} s = {rate:.0} answers/s; {expected_ok}/{} as constructed",
        pairs.len(),
        pairs.len()
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut lines = String::new();
    for ((g, r, want), got) in pairs.iter().zip(&verdicts) {
        lines.push_str(
            &serde_json::json!({"gold": g, "response": r, "constructed": want, "acpo": got})
                .to_string(),
        );
        lines.push('\n');
    }
    write_atomic(&args.out.join("verifier_pairs.jsonl"), lines.as_bytes())?;
    let report = serde_json::json!({"pairs": pairs.len(), "seconds": best, "answers_per_second": rate, "as_constructed": expected_ok});
    write_atomic(
        &args.out.join("verifier.json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;
    write_atomic(
        &args.out.join("verifier.md"),
        format!("# acpo bench verifier\n\n{} pairs (4 benchmarks' golds x boxed / Answer: / wrong), best of {}: {best:.3} s, **{rate:.0} answers/s**; {expected_ok} judged as constructed.\n\nCompare with Math-Verify: `python3 tools/bench_math_verify.py {}`\n", pairs.len(), args.repeats, args.out.join("verifier_pairs.jsonl").display()).as_bytes(),
    )?;
    println!("report: {}", args.out.join("verifier.md").display());
    Ok(Outcome::Success)
}

/// Prompts from a JSONL file with a `prompt` (or `problem`) string per line.
fn read_prompts(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let p = v
            .get("prompt")
            .or_else(|| v.get("problem"))
            .and_then(|p| p.as_str())
            .with_context(|| {
                format!(
                    "{}:{}: field `prompt` (a string) is missing",
                    path.display(),
                    i + 1
                )
            })?;
        out.push(p.to_string());
    }
    if out.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(out)
}

/// `acpo check`: validate every manifest found, print a line per run, fail on the first
/// invalid file only after reporting all of them.
fn check(args: &CheckArgs) -> anyhow::Result<Outcome> {
    let mut files = Vec::new();
    for path in &args.paths {
        files
            .extend(manifest::discover(path).with_context(|| "cannot list manifests".to_string())?);
    }
    if files.is_empty() {
        bail!(
            "no manifests (*.yaml) found under {}",
            args.paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut errors = Vec::new();
    let mut names: BTreeMap<String, PathBuf> = BTreeMap::new();
    for file in &files {
        match Experiment::load(file) {
            Ok(experiment) => {
                if let Some(other) = names.insert(experiment.name.clone(), file.clone()) {
                    errors.push(format!(
                        "{}: field `name`: `{}` is already the name of {}",
                        file.display(),
                        experiment.name,
                        other.display()
                    ));
                    continue;
                }
                println!("ok  {}", experiment.summary());
            }
            Err(err) => errors.push(err.to_string()),
        }
    }
    for error in &errors {
        eprintln!("invalid  {error}");
    }
    if errors.is_empty() {
        println!("{} manifests valid", files.len());
        Ok(Outcome::Success)
    } else {
        bail!(
            "{} of {} manifests are invalid (see above)",
            errors.len(),
            files.len()
        )
    }
}
