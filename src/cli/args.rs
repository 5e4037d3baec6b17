//! The `acpo` command line as clap types: every command and its flags, with their help.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use acpo::flags;

/// Reproduce "Advantage Clipped Policy Optimization" (ACPO): PPO/GRPO versus PPO-AC/GRPO-AC.
#[derive(Debug, Parser)]
#[command(name = "acpo", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line as the binary parses it: clap's tree of [`Cli`] with every numeric flag
    /// ([`is_numeric`]) taking a leading `-` as its value, so that `--seeds -1` is refused as
    /// out of its range, naming the flag (issue #47), not read as an unknown flag `-1`.
    pub fn command_line() -> clap::Command {
        numbers_may_be_negative(<Cli as clap::CommandFactory>::command())
    }

    /// [`Cli`] from the process's arguments, parsed by [`Cli::command_line`]; exits as clap does
    /// on a usage error (2, one message).
    pub fn from_args() -> Cli {
        let matches = Cli::command_line().get_matches();
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Whether a flag holds a number (its value parser's type): every such flag is parsed within a
/// declared range ([`acpo::flags`]).
pub fn is_numeric(arg: &clap::Arg) -> bool {
    use std::any::TypeId;
    let id = arg.get_value_parser().type_id();
    [
        TypeId::of::<usize>(),
        TypeId::of::<u64>(),
        TypeId::of::<u32>(),
        TypeId::of::<i64>(),
        TypeId::of::<f64>(),
        TypeId::of::<f32>(),
    ]
    .iter()
    .any(|t| id == *t)
}

fn numbers_may_be_negative(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        if is_numeric(&a) {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    })
    .mut_subcommands(numbers_may_be_negative)
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
    /// Evaluate a model with Avg@k, pass@k and maj@k on the manifest's benchmarks.
    Eval(EvalArgs),
    /// Build Table 1, accuracy/entropy curves, r·A tail histograms and speedups from results/.
    Report(ReportArgs),
    /// Run whatever is missing for an artifact (train, eval), then regenerate it.
    Reproduce(ReproduceArgs),
    /// A grid over manifest fields × seeds, each point paired with a baseline (issue #23).
    ///
    /// Trains what is missing under <results>/sweeps/<name>/ (side by side, resumable, like
    /// reproduce), then writes sweep.md (per grid point the paired difference to the baseline
    /// with its 95 % interval) and sweep.{png,svg}. A bad spec exits 2 naming its field.
    Sweep(SweepArgs),
    /// Fill Markdown documents' generated blocks from a folder of generated files.
    ///
    /// Each `<!-- begin: NAME -->` … `<!-- end: NAME -->` block whose file NAME the folder has
    /// gets that file's text; blocks another folder fills are left alone. With --check nothing
    /// is written, and the exit code is 1 when a block is out of date.
    Doc(DocArgs),
    /// Pack run directories into a compressed archive with a SHA256SUMS manifest.
    Archive(ArchiveArgs),
    /// Check an archive or results directory against its SHA256SUMS (exit 1 on any mismatch).
    Verify(VerifyArgs),
    /// Measure speed and memory, writing a report.
    Bench(BenchArgs),
    /// Paper runs at their own shapes on random weights, end to end, phase by phase (issue #34).
    ///
    /// Each manifest's model is replaced by random weights of its config (with the real
    /// tokenizer) and its batch sizes divided by --divisor, everything else kept; the derived
    /// runs train for --steps steps under <results>/pipeline/ (resumable), then pipeline.md gives
    /// every phase's seconds, tokens/s and peak memory, and pipeline-plan.md the GPU-hours of the
    /// paper runs costed from them. Random weights run every response to its limit: the worst
    /// case.
    Pipeline(PipelineArgs),
    /// Clipped policy mirror descent on tabular MDPs against the paper's bounds (Section 4).
    Pmd(PmdArgs),
    /// Model utilities (write a seeded random model in HF layout).
    #[command(subcommand)]
    Model(ModelCommand),
    /// Write a run's launch for another training engine.
    #[command(subcommand)]
    Export(ExportCommand),
    /// Turn another engine's logs of a run into a run directory `acpo report` reads.
    #[command(subcommand)]
    Import(ImportCommand),
}

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// verl's file-logger metrics and validation dumps of a run exported with `acpo export
    /// verl` → a sealed run directory: metrics.jsonl, eval.jsonl (every validation sample
    /// re-judged by our verifier, Avg@k), provenance (engine verl), SHA256SUMS.
    Verl {
        /// The run's manifest (the one exported).
        #[arg(long)]
        manifest: PathBuf,
        /// verl's file-logger JSONL (`$VERL_FILE_LOGGER_PATH`); repeated, one per launch attempt
        /// in the order they ran (the export's launch writes `metrics.<UTC time>.jsonl` each
        /// time: `--metrics verl-runs/NAME/metrics.*.jsonl`); a later attempt's steps replace
        /// the earlier ones' from its first step on.
        #[arg(long, required = true, num_args = 1..)]
        metrics: Vec<PathBuf>,
        /// `trainer.validation_data_dir`: the `<step>.jsonl` dumps.
        #[arg(long)]
        validation_dir: PathBuf,
        /// The run directory to create, e.g. results/paper/<name>-verl.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// A manifest as a verl launch (issue #21): launch.sh (verl's main_ppo with one Hydra
    /// override per setting) and fields.md (how verl honours every manifest field; unsupported
    /// ones are listed, never dropped).
    Verl {
        /// The run's manifest (YAML).
        manifest: PathBuf,
        /// Where launch.sh and fields.md go [default: results/verl/<name>].
        #[arg(long)]
        out: Option<PathBuf>,
        /// GPUs per node (the paper used 2-8 H100s per run).
        #[arg(long, default_value_t = 8, value_parser = flags::count(flags::MAX_GPUS_PER_NODE))]
        gpus: usize,
        #[arg(long, default_value_t = 1, value_parser = flags::count(flags::MAX_NODES))]
        nodes: usize,
        /// Also write the training set and the benchmarks as verl parquet files into OUT/data
        /// (where launch.sh looks for them).
        #[arg(long)]
        data: bool,
        /// The data directory [default: $ACPO_DATA_DIR, else ~/.cache/acpo/data].
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
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
    #[arg(long, value_parser = flags::count(flags::MAX_STEPS))]
    pub max_steps: Option<usize>,
    /// Directory with the benchmark and training JSONL files [default: $ACPO_DATA_DIR, else
    /// ~/.cache/acpo/data; a file missing there comes from the HF hub where a faithful copy exists].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
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
    /// Completions per prompt.
    #[arg(long, default_value_t = 1, value_parser = flags::count(flags::MAX_SEQUENCES))]
    pub n: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0, value_parser = acpo::generate::temperature_range())]
    pub temperature: f64,
    #[arg(long, default_value_t = 1.0, value_parser = acpo::generate::top_p_range())]
    pub top_p: f64,
    #[arg(long, value_parser = flags::count(acpo::model::MAX_VOCAB))]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 256, value_parser = flags::count(flags::MAX_TOKENS))]
    pub max_new_tokens: usize,
    #[arg(long, default_value_t = 0, value_parser = flags::seed())]
    pub seed: u64,
    /// Wrap each prompt in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    #[arg(long, value_enum, default_value_t = DType::F32)]
    pub dtype: DType,
    /// Write completions as JSONL here instead of printing them.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Decode over a paged KV cache: blocks from one pool (half the free memory on CUDA)
    /// taken as the sequences grow, the --n completions of a prompt sharing its prefill and
    /// blocks. On the CPU the same completions, bit for bit.
    #[arg(long)]
    pub paged_kv: bool,
}

impl GenerateArgs {
    /// What the flags ask the library to generate.
    pub fn options(&self) -> acpo::generate::GenerateOptions {
        acpo::generate::GenerateOptions {
            model: self.model.clone(),
            revision: self.revision.clone(),
            prompt: self.prompt.clone(),
            input: self.input.clone(),
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_new_tokens: self.max_new_tokens,
            seed: self.seed,
            chat: self.chat,
            device: self.device.into(),
            dtype: self.dtype.into(),
            paged_kv: self.paged_kv,
        }
    }
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
    #[arg(long, default_value_t = 0, value_parser = flags::from_zero(flags::MAX_STEPS))]
    pub step: usize,
    /// Where to write samples.jsonl and summary.json.
    #[arg(long)]
    pub out: PathBuf,
    /// How the KV cache holds keys and values while sampling: `model` (the model's dtype, what
    /// every result uses) or `fp8` (rounded to FP8 E4M3: on the CPU the values in the model's
    /// dtype, what an FP8 cache does to Avg@k; on a GPU the bytes, bf16 models, dense or
    /// paged).
    #[arg(long, value_enum, default_value_t = KvCache::Model)]
    pub kv_cache: KvCache,
    /// Sample over the paged KV cache whatever the manifest's `kv_layout` says: on a GPU each
    /// benchmark's samples in one call, as many decoding at once as the pool holds at their
    /// real lengths (k samples of a problem sharing its prompt's prefill and blocks); on the
    /// CPU the same samples, bit for bit (with `--kv-cache fp8`, the same up to the last bits
    /// of a log-prob: kernels/NOTES.md, version 13).
    #[arg(long)]
    pub paged_kv: bool,
}

#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Paper manifests (a model from the hub: `model.repo`).
    #[arg(required = true)]
    pub manifests: Vec<PathBuf>,
    /// Divide the prompts per step and per mini-batch by this (it must divide both).
    #[arg(long, default_value_t = 64, value_parser = flags::count(acpo::manifest::MAX_BATCH))]
    pub divisor: usize,
    /// Training steps; the evaluation and the checkpoint come after the last.
    #[arg(long, default_value_t = 2, value_parser = flags::count(flags::MAX_STEPS))]
    pub steps: usize,
    /// Problems per benchmark in the evaluation (the first ones).
    #[arg(long, default_value_t = 1, value_parser = flags::count(flags::MAX_SEQUENCES))]
    pub eval_limit: usize,
    /// A directory with the real tokenizer.json and tokenizer_config.json [default: the
    /// manifest's hub repo's, from the hub cache].
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The model configs, named after the hub repo (`qwen3-1.7b.json`).
    #[arg(long, default_value = "experiments/paper/configs")]
    pub configs: PathBuf,
    /// Where the random models are created (one per config).
    #[arg(long, default_value = "models/pipeline")]
    pub models: PathBuf,
    /// Replace every run's model config by this one: a quick check of the pipeline on a
    /// small model (the paper's shapes are its point).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run on this device instead of each manifest's.
    #[arg(long, value_enum)]
    pub device: Option<Device>,
    /// Sample every run's rollouts and evaluations over the paged KV cache (`kv_layout:
    /// paged`) whatever the manifests say.
    #[arg(long)]
    pub paged_kv: bool,
    /// Train every run with each layer's backward by hand (`model.layer_backward: by-hand`)
    /// whatever the manifests say.
    #[arg(long)]
    pub layer_by_hand: bool,
    /// Sequences per micro-batch (memory only); it must divide the responses of a divided
    /// mini-batch [default: the manifest's, made to divide them].
    #[arg(long, value_parser = flags::count(flags::MAX_SEQUENCES))]
    pub micro_batch: Option<usize>,
    /// The paper runs the plan costs.
    #[arg(long, default_value = "experiments/paper")]
    pub paper: PathBuf,
    /// Results root (the runs go under <results>/pipeline/).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Where pipeline.md and pipeline-plan.md go [default: <results>/pipeline].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Train nothing: report the runs' metrics already under <results>/pipeline/.
    #[arg(long)]
    pub report_only: bool,
    /// The prepared datasets [default: $ACPO_DATA_DIR, else ~/.cache/acpo/data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
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
    /// Read the run directories of these folders together (repeatable) instead of
    /// <results>/<scale>, and write the reports into --out: e.g. both powered archives'
    /// unpacked runs, for one verdict over all their pairs.
    #[arg(long = "runs", requires = "out")]
    pub runs: Vec<PathBuf>,
    /// Where the reports of --runs go (created if missing; its figures under
    /// <figures>/<its name>).
    #[arg(long, requires = "runs")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DocArgs {
    /// The Markdown documents to fill.
    #[arg(required = true)]
    pub docs: Vec<PathBuf>,
    /// The folder of generated files the blocks name (e.g. results/gpu/<run>/).
    #[arg(long)]
    pub from: PathBuf,
    /// Write nothing; exit 1 when a block differs from its file.
    #[arg(long)]
    pub check: bool,
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
    #[arg(long, value_parser = flags::count(acpo::reproduce::MAX_RUNS))]
    pub jobs: Option<usize>,
    /// Seeds per run: each manifest's own seed s, then s + 1, …, s + N − 1 (one run
    /// directory each). With N ≥ 2 the report adds seeds.md (each matched pair's differences
    /// with 95 % confidence intervals paired by seed) and bands across seeds on the accuracy
    /// curves. [default: 1; with --from, the archive's, which must hold every seed of every
    /// run: given, the archive must hold exactly N]
    #[arg(long, value_parser = flags::count(acpo::reproduce::MAX_RUNS))]
    pub seeds: Option<usize>,
    /// Only the manifests of these models, as the reports name them (comma-separated, e.g.
    /// `qwen3-mini-xs,qwen3-mini-s`): nothing else is trained, and the report covers the runs
    /// under --results. Default: every model of the scale.
    #[arg(long, value_delimiter = ',', conflicts_with = "from")]
    pub models: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Sweep specs (YAML: name, base, baseline, seeds, grid; src/sweep.rs documents it). Their
    /// runs are trained together; baseline runs they share are trained once.
    #[arg(required = true)]
    pub specs: Vec<PathBuf>,
    /// Results root (the sweeps write <results>/sweeps/<name>/ and share
    /// <results>/sweeps/baselines/).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Report from this archive (verified, then unpacked into <results>/from-<stem>/) or
    /// directory of finished runs, without training; every planned run must be in it.
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Also compare the sweeps: per baseline, each rule's paired difference by policy updates
    /// per step, as <reports>/NAME.md and <figures>/NAME.{png,svg}.
    #[arg(long, value_name = "NAME")]
    pub compare: Option<String>,
    /// Where the comparison's figure goes.
    #[arg(long, default_value = "figures")]
    pub figures: PathBuf,
    /// Also fill this Markdown file's `<!-- begin: NAME -->` … `<!-- end: NAME -->` blocks with
    /// the reports (NAME relative to the reports' root: `study.md`, `study-grpo-ac/sweep.md`).
    #[arg(long)]
    pub doc: Option<PathBuf>,
    /// Directory with the benchmark and training JSONL files, for real-data runs [default:
    /// $ACPO_DATA_DIR, else ~/.cache/acpo/data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Runs trained at once (as for reproduce).
    #[arg(long, value_parser = flags::count(acpo::reproduce::MAX_RUNS))]
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
    #[arg(long, default_value_t = 3, value_parser = flags::count(flags::MAX_REPEATS))]
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
    pub dtype: DType,
    /// An HF config.json to measure, on seeded random weights, instead of the built-in sizes.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// train-step: tokens per sequence, prompt included [default: 128].
    #[arg(long, value_parser = flags::count(flags::MAX_TOKENS))]
    pub seq_len: Option<usize>,
    /// Prompt tokens of each sequence [default: train-step 1 (no loss on them), generate 32].
    #[arg(long, value_parser = flags::count(flags::MAX_TOKENS))]
    pub prompt_len: Option<usize>,
    /// train-step: sequences per micro-batch [default: 4].
    #[arg(long, value_parser = flags::count(flags::MAX_SEQUENCES))]
    pub micro_batch: Option<usize>,
    /// Sequences in the step, or rows sampled (prompts × --group) [default: 8; train-step:
    /// --micro-batch when given].
    #[arg(long, value_parser = flags::count(flags::MAX_SEQUENCES))]
    pub batch: Option<usize>,
    /// train-step: the attention [default: flash on CUDA, composed on the CPU].
    #[arg(long, value_enum)]
    pub attention: Option<AttentionKind>,
    /// train-step: vocabulary chunk of the log-probs, 0 for logits by positions [default:
    /// 8192 on CUDA, 0 on the CPU].
    #[arg(long, value_parser = flags::from_zero(acpo::model::MAX_VOCAB))]
    pub vocab_chunk: Option<usize>,
    /// generate: new tokens per prompt [default: 64].
    #[arg(long, value_parser = flags::count(flags::MAX_TOKENS))]
    pub new_tokens: Option<usize>,
    /// generate: sequences decoded at once; a waiting prompt takes a finished one's place
    /// [default: all].
    #[arg(long, value_parser = flags::count(flags::MAX_SEQUENCES))]
    pub max_batch: Option<usize>,
    /// generate: responses per prompt, a GRPO group or Avg@k's k: --batch / --group prompts,
    /// each sampled --group times with its own key (over the paged KV cache a group is
    /// prefilled once and shares its prompt's blocks) [default: 1].
    #[arg(long, value_parser = flags::count(flags::MAX_SEQUENCES))]
    pub group: Option<usize>,
    /// generate: long-tailed response lengths up to --new-tokens, waves of --max-batch prompts
    /// against continuous batching.
    #[arg(long)]
    pub long_tail: bool,
    /// generate: decode over the paged KV cache; with --long-tail, a third run: continuous
    /// batching with as many rows as the pool holds.
    #[arg(long)]
    pub paged_kv: bool,
    /// generate, with --long-tail --paged-kv: the paged run alone, without the waves and the
    /// dense cache's continuous batching (a batch of many rows, where those two
    /// would cost more than it).
    #[arg(long)]
    pub paged_only: bool,
    /// generate: how the KV cache holds keys and values, `model` (its dtype) or `fp8` (E4M3
    /// bytes on a GPU, dense or paged; values rounded to E4M3 on the CPU).
    #[arg(long, value_enum, default_value_t = KvCache::Model)]
    pub kv_cache: KvCache,
    /// train-step: gradient checkpointing per decoder layer.
    #[arg(long)]
    pub checkpointing: bool,
    /// train-step (with --checkpointing): each decoder layer's backward, and the embedding's,
    /// written out by hand (each gradient written once; no autograd graph but the attention's)
    /// instead of candle's autograd over the composed layer [default: autograd].
    #[arg(long, requires = "checkpointing")]
    pub layer_by_hand: bool,
    /// train-step, attention: the flash kernels' backward on CUDA, the pair of kernels in 7
    /// products or one kernel in 5 with dQ added up in key-block order (the CPU has one
    /// backward) [default: pair].
    #[arg(long, value_enum)]
    pub flash_backward: Option<FlashBackwardKind>,
    /// train-step: trace the device's memory and time by phase (forward, head, each layer's
    /// recompute, gradients, optimizer) through one more step after the timed ones, which run
    /// untraced, beside the named tensors the step holds by arithmetic, in train-step.md and
    /// train-step.json.
    #[arg(long)]
    pub trace: bool,
    /// memory-plan: the manifests of the runs.
    #[arg(long, default_value = "experiments/paper")]
    pub experiments: PathBuf,
    /// memory-plan: the model configs, named after the hub repo (`qwen3-1.7b.json`).
    #[arg(long, default_value = "experiments/paper/configs")]
    pub configs: PathBuf,
    /// paper-plan: a directory with train-step.json and generate.json measured on CUDA (bf16),
    /// optionally generate-eval.json (the evaluations' own shape) and device.txt (the GPU
    /// suite's header line, `== suite on NAME, DRIVER, N MiB`: the memory that caps the rows
    /// carried to a paper run's contexts; tools/gpu/plan.sh writes the directory);
    /// memory-predict: a directory of CPU traces, DIR/*/train-step.json (--config: the target,
    /// default qwen3-1.7b.json of --configs); decode-predict: the GPU runs (results/gpu), whose
    /// measured copy rates price the decode attention's bytes and whose recorded memory sizes
    /// the suite's paged sampling runs' pools (--config as memory-predict's).
    #[arg(long)]
    pub measured: Option<PathBuf>,
    /// Also fill this Markdown file's `<!-- begin: NAME -->` … `<!-- end: NAME -->` blocks
    /// with the reports in --out (memory-plan.md, train-step.md, ...).
    #[arg(long)]
    pub doc: Option<PathBuf>,
}

/// The flash kernels' backward (`acpo::fused::FlashBackward`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlashBackwardKind {
    /// Two kernels, 7 products: dQ by query tiles, dK and dV by key blocks.
    Pair,
    /// One kernel, 5 products: dK and dV by key blocks adding dQ in key-block order.
    Five,
}

impl From<FlashBackwardKind> for acpo::fused::FlashBackward {
    fn from(k: FlashBackwardKind) -> Self {
        match k {
            FlashBackwardKind::Pair => Self::Pair,
            FlashBackwardKind::Five => Self::FiveProducts,
        }
    }
}

/// The attention of the train-step benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttentionKind {
    Flash,
    Composed,
}

/// What `acpo bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchKind {
    /// Sampling throughput (tokens/s).
    Generate,
    /// One RL training step (tokens/s, peak memory).
    TrainStep,
    /// The attention alone, forward and forward + backward (flash or composed).
    Attention,
    /// The memory arithmetic of the paper runs (docs/CUDA.md's table).
    MemoryPlan,
    /// The GPU-hours of the paper runs from measured GPU rates (--measured).
    PaperPlan,
    /// A train step's peak memory on a GPU, predicted from CPU traces (--measured).
    MemoryPredict,
    /// The decode attention's time per shape, predicted from its bytes at the copy rates of the
    /// GPU runs under --measured (results/gpu), and the GPU suite's paged sampling runs as the
    /// engine schedules them at each GPU's pool.
    DecodePredict,
    /// The tensor-core attention's time per shape, predicted from a model fitted to the kernels
    /// timed under --measured (results/gpu).
    AttentionPredict,
    /// The GPU driver's load of each kernel module (its JIT of the PTX, or its cache): --device
    /// cuda only.
    KernelsLoad,
    /// Verifier throughput (answers/s).
    Verifier,
}

/// What `acpo report` and `acpo reproduce` build ([`acpo::report::Artifact`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Artifact {
    /// Table 1 (Markdown, LaTeX, CSV) and the regime; with several seeds the paired
    /// differences, the verdict and the power.
    Table1,
    /// The accuracy curves (figures).
    Accuracy,
    /// The entropy curves (figures).
    Entropy,
    /// The r·Â tail histograms (figures, tails.md).
    Tails,
    /// The steps an -AC run takes to reach its baseline's best (speedup.md).
    Speedup,
    /// Every one of them.
    All,
}

impl From<Artifact> for acpo::report::Artifact {
    fn from(a: Artifact) -> Self {
        match a {
            Artifact::Table1 => Self::Table1,
            Artifact::Accuracy => Self::Accuracy,
            Artifact::Entropy => Self::Entropy,
            Artifact::Tails => Self::Tails,
            Artifact::Speedup => Self::Speedup,
            Artifact::All => Self::All,
        }
    }
}

/// `--scale`: the scales a user reproduces ([`acpo::manifest::Scale`]; the pipeline's is
/// `acpo pipeline`'s own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scale {
    Smoke,
    Mini,
    Paper,
}

impl From<Scale> for acpo::manifest::Scale {
    fn from(s: Scale) -> Self {
        match s {
            Scale::Smoke => Self::Smoke,
            Scale::Mini => Self::Mini,
            Scale::Paper => Self::Paper,
        }
    }
}

/// `--device`: where a command runs ([`acpo::model::spec::Device`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
    /// CUDA when this binary was built with it and a GPU is visible, else CPU.
    Auto,
}

impl From<Device> for acpo::model::spec::Device {
    fn from(d: Device) -> Self {
        match d {
            Device::Cpu => Self::Cpu,
            Device::Cuda => Self::Cuda,
            Device::Auto => Self::Auto,
        }
    }
}

/// `--kv-cache`: how sampling's KV cache holds keys and values
/// ([`acpo::model::qwen::KvCacheDtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCache {
    Model,
    Fp8,
}

impl From<KvCache> for acpo::model::qwen::KvCacheDtype {
    fn from(k: KvCache) -> Self {
        match k {
            KvCache::Model => Self::Model,
            KvCache::Fp8 => Self::Fp8E4m3,
        }
    }
}

/// `--dtype`: the precision a model is held in ([`acpo::model::spec::DType`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DType {
    F32,
    Bf16,
    F16,
}

impl From<DType> for acpo::model::spec::DType {
    fn from(d: DType) -> Self {
        match d {
            DType::F32 => Self::F32,
            DType::Bf16 => Self::Bf16,
            DType::F16 => Self::F16,
        }
    }
}

#[derive(Debug, Args)]
pub struct PmdArgs {
    /// Where the figure and the Markdown table go.
    #[arg(long, default_value = "figures")]
    pub out: PathBuf,
    /// First random MDP's seed (the others follow).
    #[arg(long, default_value_t = 0, value_parser = flags::seed())]
    pub seed: u64,
    /// Random MDPs in the grid.
    #[arg(long, default_value_t = 5, value_parser = flags::count_u64(flags::MAX_MDPS))]
    pub mdps: u64,
    /// PMD iterations per run.
    #[arg(long, default_value_t = 100, value_parser = flags::count(flags::MAX_PMD_ITERATIONS))]
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
        #[arg(long, default_value_t = 0, value_parser = flags::seed())]
        seed: u64,
        /// Also write a character-level tokenizer (printable ASCII; vocab_size must be ≥ 98).
        #[arg(long)]
        char_tokenizer: bool,
        /// Also train and write a byte-level BPE tokenizer on the synthetic task's corpus, up to
        /// the config's vocab_size (≥ 258).
        #[arg(long, conflicts_with = "char_tokenizer")]
        bpe_tokenizer: bool,
        /// Also copy a real tokenizer: the tokenizer.json and tokenizer_config.json of this
        /// directory (its vocabulary must fit the config's vocab_size).
        #[arg(long, conflicts_with_all = ["char_tokenizer", "bpe_tokenizer"])]
        tokenizer_from: Option<PathBuf>,
    },
    /// A model directory transformers loads whole (AutoModelForCausalLM and AutoTokenizer):
    /// config.json, the weights, the tokenizer's files and a generation_config.json.
    ///
    /// SOURCE is a run directory (its latest complete checkpoint, or --step's; the tokenizer of
    /// its manifest's model) or a model directory in HF layout. OUT must not exist.
    Export {
        /// A run directory (holding manifest.yaml) or a model directory (config.json + weights).
        source: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// The checkpoint of this step (run directories only; default: the latest).
        #[arg(long, value_parser = flags::from_zero(flags::MAX_STEPS))]
        step: Option<usize>,
        /// Take tokenizer.json, tokenizer_config.json (and the other tokenizer files present)
        /// from this directory instead.
        #[arg(long)]
        tokenizer_from: Option<PathBuf>,
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
        dtype: DType,
    },
}
