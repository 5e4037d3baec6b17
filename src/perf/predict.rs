//! The peak memory of a paper-shape train step on a GPU, predicted from train steps traced on
//! the CPU before a GPU is lent (issue #44): `acpo bench memory-predict`.
//!
//! The CPU runs `acpo bench train-step --trace` at the target's layer shapes (hidden size,
//! heads, MLP width) with one or two layers and a small vocabulary, in f32, with the GPU's
//! kernels (flash attention, vocabulary chunks, checkpointing; each turned off in turn)
//! (tools/checks/memory_trace.sh). The binary's allocator is counted (`device::Counting`), so
//! each phase's reading is the bytes of the tensors alive, as the CUDA pool counts them. A
//! phase's peak above the step's starting state is split in two:
//! - what arithmetic names exactly (`named`): the gradient sums so far, the bf16 compute copy
//!   of the weights, each layer's checkpointed input, the lm_head's leaf and its gradient (tied
//!   embeddings); these are set at the target's layers, vocabulary and dtype;
//! - the rest, the phase's working set (activations, temporaries), measured. Its law (`Law`)
//!   is linear in the tokens it grows with (every position's in the layers, the responses' at
//!   the vocabulary end), the vocabulary and, without checkpointing, the layers; each slope is
//!   fitted from two traces that differ in that alone. A saving turned off adds its own bytes
//!   over all savings', traced once and grown by its term's law: the composed attention's
//!   `(B, H, T, T)` as B·T², the logits by positions as the responses' tokens times the
//!   vocabulary.
//!
//! The traces of another micro-batch than the fit's check it (`checks`). The working set ran
//! in f32 and runs in bf16 on the GPU: the prediction counts it at half its bytes, the bound at
//! its measured bytes (the vocabulary chunks' temporaries and a layer's gradients are f32 on the
//! GPU too). The optimizer step updates in place on CUDA (kernels/adamw.cu): its working set is
//! its tables, not the CPU update's copies.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{memory, write_report, PerfError, Result, StepSettings};
use crate::device::Mark;
use crate::files::AtPath;
use crate::model::QwenConfig;
use crate::report::table::{Align::Left, Align::Right, Table};

/// Which of the memory savings a run had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Flash attention, per-layer checkpointing and vocabulary chunks.
    AllSavings,
    NoFlash,
    NoCheckpointing,
    NoVocabChunks,
    /// All savings, with the attention's backward in 5 products on CUDA
    /// (`--flash-backward five`): each layer's backward also holds dQ's f32 sums and the
    /// counters that order the adds, GPU-only buffers named by arithmetic
    /// ([`crate::perf::flash_predict::five_product_scratch`]); no trace of its own (the CPU runs
    /// one backward), its working sets those of all savings.
    FiveProducts,
    /// All savings, each layer's backward by hand (`--layer-by-hand`, issue #59): the layer's
    /// forward keeps the activations its backward reads where autograd keeps its graph, and the
    /// embedding's gradient is written once into its f32 sum. Traced on its own (the CPU runs
    /// the same code path with its twins), at two lengths and two vocabularies.
    LayerByHand,
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::AllSavings,
        Variant::NoFlash,
        Variant::NoCheckpointing,
        Variant::NoVocabChunks,
        Variant::FiveProducts,
        Variant::LayerByHand,
    ];

    /// The variant whose traces stand for this one's working sets.
    fn traced(self) -> Variant {
        match self {
            Variant::FiveProducts => Variant::AllSavings,
            v => v,
        }
    }

    /// The variant a traced run stands for: at most one saving off, or every saving on with
    /// the layers by hand; None for any other mix.
    fn of(s: &StepSettings) -> Option<Variant> {
        let savings = (s.flash_attention, s.checkpointing, s.vocab_chunk.is_some());
        match (savings, s.layer_by_hand) {
            ((true, true, true), true) => Some(Variant::LayerByHand),
            (_, true) => None,
            ((true, true, true), false) => Some(Variant::AllSavings),
            ((false, true, true), false) => Some(Variant::NoFlash),
            ((true, false, true), false) => Some(Variant::NoCheckpointing),
            ((true, true, false), false) => Some(Variant::NoVocabChunks),
            _ => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Variant::AllSavings => "all (flash, checkpointing, vocabulary chunks)",
            Variant::NoFlash => "no flash attention",
            Variant::NoCheckpointing => "no checkpointing",
            Variant::NoVocabChunks => "no vocabulary chunks",
            Variant::FiveProducts => "all, the attention backward in 5 products",
            Variant::LayerByHand => "all, each layer's backward by hand",
        }
    }
}

/// A phase of a train step, as `device::mark` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ComputeCopy,
    /// Checkpointing: the layers without a graph, every layer's input kept.
    Forward,
    Head,
    Layer(usize),
    Embedding,
    MicroBatch,
    Optimizer,
    /// No checkpointing: the forward with its graph and the loss.
    ForwardGraph,
    Backward,
}

impl Phase {
    fn of(name: &str) -> Option<Phase> {
        let layer = name
            .strip_prefix("layer ")
            .and_then(|r| r.split(':').next())
            .and_then(|i| i.parse().ok());
        Some(match name {
            _ if layer.is_some() => Phase::Layer(layer?),
            _ if name.ends_with("the compute copy of the weights") => Phase::ComputeCopy,
            _ if name.starts_with("forward without a graph") => Phase::Forward,
            _ if name.starts_with("head:") => Phase::Head,
            _ if name.starts_with("embedding:") => Phase::Embedding,
            _ if name.starts_with("micro-batch ") => Phase::MicroBatch,
            _ if name.ends_with("the optimizer step") => Phase::Optimizer,
            _ if name.starts_with("forward with a graph") => Phase::ForwardGraph,
            _ if name == "backward" => Phase::Backward,
            _ => return None,
        })
    }

    /// The phases whose working sets are fitted and set at the target: every layer is one.
    fn kind(self) -> Phase {
        match self {
            Phase::Layer(_) => Phase::Layer(0),
            p => p,
        }
    }

    fn label(self) -> String {
        match self {
            Phase::ComputeCopy => "the compute copy".into(),
            Phase::Forward => "the forward without a graph".into(),
            Phase::Head => "the head (loss and its backward)".into(),
            Phase::Layer(i) => format!("layer {i}'s recompute and backward"),
            Phase::Embedding => "the embedding's backward".into(),
            Phase::MicroBatch => "the gradients added up".into(),
            Phase::Optimizer => "the optimizer step".into(),
            Phase::ForwardGraph => "the forward with its graph".into(),
            Phase::Backward => "the backward".into(),
        }
    }
}

/// The sizes the named tensors are made of.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    layers: u64,
    vocab: u64,
    hidden: u64,
    /// Tokens of a micro-batch.
    tokens: u64,
    params: u64,
    layer_params: u64,
    /// Parameters whose gradients the head's backward gives: the final norm, and the lm_head
    /// when it is not the embedding.
    head_params: u64,
    /// Bytes of the compute dtype.
    compute: u64,
    tied: bool,
    /// GPU-only bytes a layer's backward holds besides its working set: the 5-product
    /// backward's dQ sums and counters, or none.
    layer_scratch: u64,
}

impl Sizes {
    fn of(cfg: &QwenConfig, micro_batch: usize, seq_len: usize, compute: u64) -> Sizes {
        let layer_params: u64 = crate::model::init::layout(cfg)
            .iter()
            .filter(|(name, _, _)| name.starts_with("model.layers.0."))
            .map(|(_, shape, _)| shape.iter().product::<usize>() as u64)
            .sum();
        let (v, h) = (cfg.vocab_size as u64, cfg.hidden_size as u64);
        Sizes {
            layers: cfg.num_hidden_layers as u64,
            vocab: v,
            hidden: h,
            tokens: (micro_batch * seq_len) as u64,
            params: memory::parameters(cfg, false),
            layer_params,
            head_params: h + if cfg.tie_word_embeddings { 0 } else { v * h },
            compute,
            tied: cfg.tie_word_embeddings,
            layer_scratch: 0,
        }
    }
}

/// The bytes phase `p` holds above the step's starting state (masters, moments, the batch)
/// that arithmetic names: the gradient sums added so far (f32), the compute copy of the
/// weights (bf16 only; made for the mini-batch, dropped before the optimizer step), each
/// layer's input still kept (checkpointing: layer i's backward still has inputs 0..=i), and
/// with tied embeddings the lm_head's leaf copy and its gradient, alive from the head to the
/// embedding's backward (`Qwen::checkpointed_backward`); and a layer's GPU-only scratch during
/// its backward ([`Sizes::layer_scratch`]).
fn named(p: Phase, s: &Sizes) -> u64 {
    let copy = if s.compute == 2 { 2 * s.params } else { 0 };
    let input = s.tokens * s.hidden * s.compute;
    let lm = if s.tied {
        2 * s.vocab * s.hidden * s.compute
    } else {
        0
    };
    match p {
        Phase::ComputeCopy | Phase::ForwardGraph => copy,
        Phase::Forward => copy + s.layers * input,
        Phase::Head => copy + s.layers * input + 4 * s.head_params + lm,
        Phase::Layer(i) => {
            let i = i as u64;
            copy + (i + 1) * input
                + 4 * (s.head_params + (s.layers - i) * s.layer_params)
                + lm
                + s.layer_scratch
        }
        Phase::Embedding => copy + 4 * s.params + lm,
        Phase::MicroBatch | Phase::Backward => copy + 4 * s.params,
        Phase::Optimizer => 4 * s.params,
    }
}

/// One traced CPU run: its settings, and each phase's working set (its peak above the starting
/// state less [`named`]), the largest of a kind.
#[derive(Debug, Clone)]
struct Run {
    settings: StepSettings,
    variant: Variant,
    start: u64,
    params: u64,
    working: Vec<(Phase, i64)>,
    /// The measured peak above the starting state, and at which phase.
    peak: (u64, Phase),
}

/// What a train-step report holds that the prediction reads.
#[derive(Debug, Deserialize)]
struct Report {
    parameters: u64,
    settings: Option<StepSettings>,
    trace: Option<Vec<Mark>>,
}

impl Run {
    fn load(path: &Path) -> Result<Run> {
        let bad = |reason: String| PerfError::Shape(format!("{}: {reason}", path.display()));
        let text = crate::files::read_to_string(path).at(path)?;
        let reports: Vec<Report> = serde_json::from_str(&text)
            .map_err(|e| bad(format!("not a train-step report: {e}")))?;
        let [r] = <[Report; 1]>::try_from(reports)
            .map_err(|r| bad(format!("{} measurements, not one", r.len())))?;
        let (Some(settings), Some(trace)) = (r.settings, r.trace) else {
            return Err(bad(
                "no settings or no trace (acpo bench train-step --trace)".into(),
            ));
        };
        let variant = Variant::of(&settings).ok_or_else(|| {
            bad("more than one saving off, or a saving off with the layers by hand".into())
        })?;
        if settings.compute != "f32" {
            return Err(bad(format!("computed in {}, not f32", settings.compute)));
        }
        check_settings(&settings).map_err(|e| bad(format!("field `settings.{e}")))?;
        let read = |m: &Mark| {
            let (live, peak) = m
                .live
                .zip(m.peak)
                .ok_or_else(|| bad(format!("`{}` has no reading", m.phase)))?;
            if peak > MAX_READING || live > peak {
                return Err(bad(format!(
                    "field `trace`: `{}` reads {live} bytes live and {peak} at the peak: a reading is at most {MAX_READING} bytes and its peak at least what is live",
                    m.phase
                )));
            }
            Ok((live, peak))
        };
        let start = read(trace.first().ok_or_else(|| bad("an empty trace".into()))?)?.0;
        let cfg = settings_config(&settings).map_err(|e| bad(format!("field `settings`: {e}")))?;
        if r.parameters != memory::parameters(&cfg, false) {
            return Err(bad(format!(
                "field `parameters`: {} parameters, the settings' model has {}",
                r.parameters,
                memory::parameters(&cfg, false)
            )));
        }
        let sizes = Sizes::of(&cfg, settings.micro_batch, settings.seq_len, 4);
        let (mut working, mut peak) = (Vec::<(Phase, i64)>::new(), (0, Phase::ComputeCopy));
        for m in &trace[1..] {
            let Some(phase) = Phase::of(&m.phase) else {
                continue;
            };
            match phase {
                Phase::Layer(i) if i >= settings.layers => {
                    return Err(bad(format!(
                        "field `trace`: `{}` is layer {i}, the run has {} layers",
                        m.phase, settings.layers
                    )))
                }
                _ => {}
            }
            let above = read(m)?.1.saturating_sub(start);
            if above > peak.0 {
                peak = (above, phase);
            }
            let w = above as i64 - named(phase, &sizes) as i64;
            match working.iter_mut().find(|(k, _)| *k == phase.kind()) {
                Some((_, x)) => *x = (*x).max(w),
                None => working.push((phase.kind(), w)),
            }
        }
        Ok(Run {
            settings,
            variant,
            start,
            params: r.parameters,
            working,
            peak,
        })
    }

    fn working(&self, kind: Phase) -> i64 {
        self.working
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, x)| *x)
    }
}

/// The most bytes a reading may hold (1 PiB, beyond any machine's memory): a larger one is not
/// a measurement, and it would move every fitted law.
const MAX_READING: u64 = 1 << 50;

/// Refuses a traced run's shape that no train step ran: the step's sizes each in the range its
/// flag has ([`crate::flags`]), the prompt shorter than the sequence, the micro-batch within the
/// batch, the vocabulary chunk within the vocabulary. The error starts with the field's name.
fn check_settings(s: &StepSettings) -> std::result::Result<(), String> {
    use crate::flags::{MAX_SEQUENCES, MAX_TOKENS};
    let ranges = [
        ("batch", s.batch, 1, MAX_SEQUENCES),
        ("micro_batch", s.micro_batch, 1, s.batch),
        ("seq_len", s.seq_len, 2, MAX_TOKENS),
        ("prompt_len", s.prompt_len, 1, s.seq_len.saturating_sub(1)),
        ("vocab_chunk", s.vocab_chunk.unwrap_or(1), 1, s.vocab.max(1)),
    ];
    for (field, value, low, high) in ranges {
        if !(low..=high).contains(&value) {
            return Err(format!(
                "{field}`: must be in [{low}, {high}], got {value} (batch {}, micro_batch {}, seq_len {}, prompt_len {}, vocab {})",
                s.batch, s.micro_batch, s.seq_len, s.prompt_len, s.vocab
            ));
        }
    }
    Ok(())
}

/// The config a run measured (the target's shapes but its layers and vocabulary).
fn settings_config(s: &StepSettings) -> Result<QwenConfig> {
    let json = serde_json::json!({
        "model_type": "qwen3", "vocab_size": s.vocab, "hidden_size": s.hidden,
        "intermediate_size": s.intermediate, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": s.tied,
        "max_position_embeddings": 40960, "hidden_act": "silu",
    });
    Ok(QwenConfig::from_json(
        &json.to_string(),
        Path::new("<traced run>"),
    )?)
}

/// A micro-batch's shape: sequences, tokens each, the first `prompt_len` of them prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shape {
    pub micro_batch: usize,
    pub seq_len: usize,
    pub prompt_len: usize,
}

/// The shapes predicted: the GPU suite's train steps (tools/gpu/suite.sh) and the twin's,
/// micro-batches of 2 sequences of 2,048 and of 9,220 tokens, the first 1,024 of them prompt.
pub const SHAPES: [Shape; 2] = [
    Shape {
        micro_batch: 2,
        seq_len: 2048,
        prompt_len: 1024,
    },
    Shape {
        micro_batch: 2,
        seq_len: 9220,
        prompt_len: 1024,
    },
];

impl Shape {
    fn of(s: &StepSettings) -> Shape {
        Shape {
            micro_batch: s.micro_batch,
            seq_len: s.seq_len,
            prompt_len: s.prompt_len,
        }
    }

    /// The tokens a phase's working set grows with: the responses' at the vocabulary end (the
    /// head reads the response positions only), none in the phases sized by the parameters,
    /// every position's elsewhere (the layers, the embedding; without checkpointing, the
    /// forward with its graph and the backward, whose layers outweigh the head).
    fn tokens(self, kind: Phase) -> f64 {
        match kind {
            Phase::Head => (self.micro_batch * (self.seq_len - self.prompt_len)) as f64,
            Phase::ComputeCopy | Phase::MicroBatch | Phase::Optimizer => 0.0,
            _ => (self.micro_batch * self.seq_len) as f64,
        }
    }
}

/// A phase's working set in the tokens X it grows with, the vocabulary V and the layers L:
/// c + s·X + v·(V − V₀) + l·(L − 1)·X.
#[derive(Debug, Clone, Copy)]
struct Law {
    c: f64,
    s: f64,
    v: f64,
    v0: f64,
    l: f64,
}

impl Law {
    fn at(&self, x: f64, vocab: f64, layers: f64) -> f64 {
        self.c + self.s * x + self.v * (vocab - self.v0) + self.l * (layers - 1.0) * x
    }
}

/// The traced runs the laws are fitted from: those of the smallest micro-batch (the others,
/// if any, check the fit: [`checks`]).
struct Model<'a> {
    runs: Vec<&'a Run>,
}

impl<'a> Model<'a> {
    fn new(all: &'a [Run]) -> Model<'a> {
        let b = all
            .iter()
            .map(|r| r.settings.micro_batch)
            .min()
            .unwrap_or(0);
        Model {
            runs: all.iter().filter(|r| r.settings.micro_batch == b).collect(),
        }
    }

    fn of(&self, v: Variant, kind: Phase) -> Vec<&'a Run> {
        self.runs
            .iter()
            .copied()
            .filter(|r| r.variant == v && r.working.iter().any(|(k, _)| *k == kind))
            .collect()
    }

    /// Whether `v`'s traces of `kind` were made at more than one vocabulary.
    fn varies_vocabulary(&self, v: Variant, kind: Phase) -> bool {
        let runs = self.of(v, kind);
        runs.iter()
            .any(|r| r.settings.vocab != runs[0].settings.vocab)
    }

    /// The law of `kind` in variant `v` where it is fitted directly: from the run with one
    /// layer, the smallest vocabulary and the most tokens, a run differing in the tokens alone
    /// gives the slope (else the working set is taken as proportional to the tokens), one
    /// differing in the vocabulary alone the change a vocabulary row makes (else `borrowed`'s),
    /// and one with more layers the change a layer makes per token.
    fn fitted(&self, v: Variant, kind: Phase, borrowed: Option<Law>) -> Option<Law> {
        let runs = self.of(v, kind);
        let base = runs.iter().min_by(|a, b| {
            let key = |r: &Run| {
                (
                    r.settings.layers,
                    r.settings.vocab,
                    std::cmp::Reverse(r.settings.micro_batch * r.settings.seq_len),
                )
            };
            key(a).cmp(&key(b))
        })?;
        let (l0, v0, shape) = (
            base.settings.layers,
            base.settings.vocab,
            Shape::of(&base.settings),
        );
        let (x0, w0) = (shape.tokens(kind), base.working(kind) as f64);
        let w = |r: &Run| r.working(kind) as f64;
        let s = runs
            .iter()
            .filter(|r| r.settings.layers == l0 && r.settings.vocab == v0)
            .map(|r| (Shape::of(&r.settings).tokens(kind), w(r)))
            .find(|(x, _)| *x != x0)
            .map(|(x, wr)| (wr - w0) / (x - x0))
            .unwrap_or(if x0 > 0.0 { w0 / x0 } else { 0.0 });
        let per_row = runs
            .iter()
            .find(|r| {
                r.settings.layers == l0 && Shape::of(&r.settings) == shape && r.settings.vocab > v0
            })
            .map(|r| (w(r) - w0) / (r.settings.vocab - v0) as f64)
            .or(borrowed.map(|b| b.v))
            .unwrap_or(0.0);
        let per_layer = runs
            .iter()
            .find(|r| {
                r.settings.vocab == v0 && Shape::of(&r.settings) == shape && r.settings.layers > l0
            })
            .filter(|_| x0 > 0.0)
            .map(|r| (w(r) - w0) / ((r.settings.layers - l0) as f64 * x0))
            .unwrap_or(0.0);
        Some(Law {
            c: w0 - s * x0,
            s,
            v: per_row,
            v0: v0 as f64,
            l: per_layer,
        })
    }

    /// `kind`'s working set in variant `v` for micro-batches of `shape`, at `vocab` and
    /// `layers`, in the measured (f32) bytes.
    fn working(
        &self,
        v: Variant,
        kind: Phase,
        shape: Shape,
        vocab: f64,
        layers: f64,
    ) -> Option<f64> {
        let all = |k: Phase| self.fitted(Variant::AllSavings, k, None);
        match v {
            Variant::AllSavings | Variant::FiveProducts => {
                Some(all(kind)?.at(shape.tokens(kind), vocab, layers))
            }
            Variant::LayerByHand => {
                // Its own traces give each phase's constant, its growth in the tokens and in
                // the vocabulary: the embedding's backward and the gradient sums are another
                // code's, whose vocabulary term all savings' traces would overstate several
                // times. Only the head, the same code either way, may take all savings' term
                // where no by-hand run varied the vocabulary; another phase is then not
                // predicted.
                if kind != Phase::Head && !self.varies_vocabulary(v, kind) {
                    return None;
                }
                let borrowed = if kind == Phase::Head { all(kind) } else { None };
                Some(
                    self.fitted(v, kind, borrowed)?
                        .at(shape.tokens(kind), vocab, layers),
                )
            }
            Variant::NoCheckpointing => {
                // Without checkpointing the vocabulary's terms sit in the forward (the head) and
                // the backward (the embedding's gradient): borrowed from those phases' laws.
                let like = match kind {
                    Phase::ForwardGraph => all(Phase::Head),
                    Phase::Backward => all(Phase::Embedding),
                    k => all(k),
                };
                Some(
                    self.fitted(v, kind, like)?
                        .at(shape.tokens(kind), vocab, layers),
                )
            }
            Variant::NoFlash | Variant::NoVocabChunks => {
                // The saving's own bytes, over all savings' at the run that traced it: the
                // composed attention's (B, H, T, T) grow as B·T², the logits by positions as
                // the responses' tokens times the vocabulary.
                let run = *self.of(v, kind).first()?;
                let at = Shape::of(&run.settings);
                let (v_at, l_at) = (run.settings.vocab as f64, run.settings.layers as f64);
                let saving = run.working(kind) as f64 - all(kind)?.at(at.tokens(kind), v_at, l_at);
                let growth = match (v, shape.tokens(kind) > 0.0) {
                    (_, false) => 1.0,
                    (Variant::NoFlash, true) => {
                        (shape.micro_batch * shape.seq_len * shape.seq_len) as f64
                            / (at.micro_batch * at.seq_len * at.seq_len) as f64
                    }
                    _ => {
                        Shape::tokens(shape, Phase::Head) * vocab
                            / (Shape::tokens(at, Phase::Head) * v_at)
                    }
                };
                Some(all(kind)?.at(shape.tokens(kind), vocab, layers) + saving * growth)
            }
        }
    }

    /// The largest peak above the step's start over `kinds`' phases, with the model of `sizes`,
    /// each working set at `factor` of its measured bytes: (bytes, phase), and the bound (the
    /// working sets at their measured bytes).
    fn peak(
        &self,
        v: Variant,
        shape: Shape,
        sizes: &Sizes,
        factor: f64,
    ) -> Option<(f64, Phase, f64)> {
        let v = v.traced();
        let kinds: Vec<Phase> = self
            .runs
            .iter()
            .filter(|r| r.variant == v)
            .flat_map(|r| r.working.iter().map(|(k, _)| *k))
            .fold(Vec::new(), |mut ks, k| {
                if !ks.contains(&k) {
                    ks.push(k);
                }
                ks
            });
        let mut best: Option<(f64, Phase, f64)> = None;
        for kind in kinds {
            let w = self.working(v, kind, shape, sizes.vocab as f64, sizes.layers as f64)?;
            // The optimizer step updates in place on CUDA: only its tables are new.
            let w = if kind == Phase::Optimizer && factor < 1.0 {
                0.0
            } else {
                w
            };
            let phases: Vec<Phase> = match kind {
                Phase::Layer(_) => (0..sizes.layers as usize).map(Phase::Layer).collect(),
                k => vec![k],
            };
            for p in phases {
                let named = named(p, sizes) as f64;
                let (got, bound) = (named + factor * w, named + w);
                let (b0, p0, bound0) = best.unwrap_or((f64::MIN, p, f64::MIN));
                best = Some(if got > b0 {
                    (got, p, bound0.max(bound))
                } else {
                    (b0, p0, bound0.max(bound))
                });
            }
        }
        best
    }
}

/// One predicted peak.
#[derive(Debug, Clone, Serialize)]
pub struct Predicted {
    pub shape: Shape,
    pub variant: Variant,
    /// The working sets at bf16's bytes.
    pub peak: u64,
    /// The working sets at the f32 bytes measured.
    pub bound: u64,
    /// The phase of the predicted peak.
    pub phase: String,
}

/// The peak of each variant at each of `shapes`, for the model `target` in bf16 with f32
/// masters, from `runs`.
fn predict(runs: &[Run], target: &QwenConfig, shapes: &[Shape]) -> Result<Vec<Predicted>> {
    let model = Model::new(runs);
    let base = model
        .of(Variant::AllSavings, Phase::Head)
        .into_iter()
        .min_by_key(|r| (r.settings.layers, r.settings.vocab))
        .ok_or_else(|| PerfError::Shape("no traced run with every saving on".into()))?;
    // The step's starting state: masters and moments (12 bytes a parameter), and what else was
    // alive (the batch, the process's own heap), as the traced run had it.
    let overhead = base.start.saturating_sub(12 * base.params);
    let mut out = Vec::new();
    for &shape in shapes {
        let sizes = Sizes::of(target, shape.micro_batch, shape.seq_len, 2);
        let start = 12 * sizes.params + overhead;
        for v in Variant::ALL {
            let layer_scratch = match v {
                Variant::FiveProducts => super::flash_predict::five_product_scratch(
                    shape.micro_batch,
                    target.num_attention_heads,
                    target.head_dim(),
                    shape.seq_len,
                ),
                _ => 0,
            };
            let sizes = Sizes {
                layer_scratch,
                ..sizes
            };
            let Some((peak, phase, bound)) = model.peak(v, shape, &sizes, 0.5) else {
                continue;
            };
            out.push(Predicted {
                shape,
                variant: v,
                peak: start + peak.max(0.0) as u64,
                bound: start + bound.max(0.0) as u64,
                phase: phase.label(),
            });
        }
    }
    Ok(out)
}

/// The fit against the traced runs it was not made from (another micro-batch): each one's
/// measured peak above its start beside the laws' at its own sizes, in f32.
fn checks(runs: &[Run]) -> Vec<(String, u64, u64)> {
    let model = Model::new(runs);
    let fitted = model.runs.first().map(|r| r.settings.micro_batch);
    runs.iter()
        .filter(|r| Some(r.settings.micro_batch) != fitted)
        .filter_map(|r| {
            let cfg = settings_config(&r.settings).ok()?;
            let sizes = Sizes::of(&cfg, r.settings.micro_batch, r.settings.seq_len, 4);
            let (predicted, _, _) = model.peak(r.variant, Shape::of(&r.settings), &sizes, 1.0)?;
            let what = format!(
                "{} × {} tokens, {} layer(s), vocabulary {}, {}",
                r.settings.micro_batch,
                r.settings.seq_len,
                r.settings.layers,
                r.settings.vocab,
                r.variant.label()
            );
            Some((what, r.peak.0, predicted.max(0.0) as u64))
        })
        .collect()
}

/// The PyTorch twin's measured peak for micro-batches of `len` tokens: `peak_bytes` of
/// `twin/torch-train-<len>.json` under `dir` (tools/twins/bench_train_torch.py's report,
/// copied from the GPU run that measured it).
fn twin_peak(dir: &Path, len: usize) -> Option<u64> {
    let path = dir.join("twin").join(format!("torch-train-{len}.json"));
    let text = crate::files::read_to_string(&path).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["peak_bytes"].as_u64()
}

/// `acpo bench memory-predict`: the train-step reports `*/train-step.json` under `measured`
/// (CPU traces, f32), the target model's config, and the twin's peaks under `measured/twin`;
/// writes `memory-predicted.{json,md}` under `out`.
pub fn memory_predict(measured: &Path, target: &Path, out: &Path) -> Result<PathBuf> {
    // A folder without a trace (the twin's, the configs') is not a run; anything else named
    // `train-step.json` than a regular file is refused, never skipped.
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(measured).at(measured)? {
        let path = entry.at(measured)?.path().join("train-step.json");
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
            other => other.at(&path)?,
        };
        crate::files::regular(&path).at(&path)?;
        paths.push(path);
    }
    paths.sort();
    let runs = paths
        .iter()
        .map(|p| Run::load(p))
        .collect::<Result<Vec<_>>>()?;
    let cfg = QwenConfig::load(target)?;
    let rows = predict(&runs, &cfg, &SHAPES)?;
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the prediction is JSON");
    write_report(out, "memory-predicted.json", json.as_bytes())?;
    let md = markdown(&rows, &runs, &checks(&runs), measured, target);
    write_report(out, "memory-predicted.md", md.as_bytes())
}

fn markdown(
    rows: &[Predicted],
    runs: &[Run],
    checks: &[(String, u64, u64)],
    measured: &Path,
    target: &Path,
) -> String {
    let mut t = Table::new([
        ("micro-batch × tokens", Left),
        ("savings", Left),
        ("predicted peak (GiB)", Right),
        ("bound (GiB)", Right),
        ("at", Left),
        ("PyTorch twin, measured (GiB)", Right),
    ]);
    for r in rows {
        let twin = (r.variant == Variant::AllSavings)
            .then(|| twin_peak(measured, r.shape.seq_len))
            .flatten();
        t.row([
            format!("{} × {}", r.shape.micro_batch, r.shape.seq_len),
            r.variant.label().into(),
            memory::gib(r.peak),
            memory::gib(r.bound),
            r.phase.clone(),
            twin.map_or_else(|| "—".into(), memory::gib),
        ]);
    }
    let traced = |v: Variant| {
        let mut shapes: Vec<String> = runs
            .iter()
            .filter(|r| r.variant == v)
            .map(|r| {
                format!(
                    "{} × {}{}{}",
                    r.settings.micro_batch,
                    r.settings.seq_len,
                    if r.settings.layers > 1 {
                        ", 2 layers"
                    } else {
                        ""
                    },
                    if r.settings.vocab > 16384 {
                        ", vocabulary 32,768"
                    } else {
                        ""
                    },
                )
            })
            .collect();
        shapes.sort();
        shapes.join("; ")
    };
    let mut s = format!(
        "**Predicted, not measured on a GPU.** `{}` (28 layers, vocabulary 151,936) in bf16 with fp32 masters, one micro-batch of prompt 1,024, by `acpo bench memory-predict` (`perf::predict`) from {} train steps traced on the CPU in `{}` (`acpo bench train-step --trace`, f32, the same layer shapes with one layer and a vocabulary of 16,384 unless said; the counting allocator's bytes in use). The tensors arithmetic names (the fp32 masters, moments and gradient sums, the bf16 compute copy, each layer's checkpointed input, the tied lm_head's leaf and gradient) are set at the target's sizes; each phase's working set, measured, grows linearly in the tokens (the responses' at the vocabulary end), the vocabulary and, without checkpointing, the layers, fitted from the traces:\n\n",
        target.display(),
        runs.len(),
        measured.display(),
    );
    for v in Variant::ALL.into_iter().filter(|v| v.traced() == *v) {
        let shapes = traced(v);
        if !shapes.is_empty() {
            s.push_str(&format!("- {}: {shapes}\n", v.label()));
        }
    }
    s.push_str("\nThe prediction counts the working sets at bf16's bytes, half the f32 bytes traced; the bound at the bytes traced (the vocabulary chunks' temporaries and a layer's gradients are f32 on the GPU as well). The composed attention's excess over flash attention grows as B·T², the logits by positions' as the responses' tokens times the vocabulary. The optimizer step updates in place on CUDA (kernels/adamw.cu): in the prediction its working set is nil. The attention backward in 5 products (`--flash-backward five`) has all savings' working sets, and each layer's backward holds dQ's f32 sums and the counters ordering its adds besides (B·H·T·D·4 bytes and a counter per 64 query rows: CUDA-only buffers, counted exactly).\n\n");
    s.push_str(&t.to_string());
    for (what, got, predicted) in checks {
        s.push_str(&format!(
            "\nCheck of the fit on a trace it was not made from ({what}): {} GiB above the step's start predicted, {} GiB measured ({:+.1} %).\n",
            memory::gib(*predicted),
            memory::gib(*got),
            100.0 * (*predicted as f64 - *got as f64) / (*got).max(1) as f64,
        ));
    }
    s.push_str(&targets(rows));
    s
}

/// Each memory target's line, at the longest predicted length: issue #44's limit for the step
/// as the trainer runs it, issue #59's for the step it is to become, the layers by hand.
fn targets(rows: &[Predicted]) -> String {
    let mut s = String::new();
    for (variant, step, issue, gib) in [
        (Variant::AllSavings, "the step", 44, 60u64),
        (
            Variant::LayerByHand,
            "the step with each layer's backward by hand",
            59,
            40,
        ),
    ] {
        let Some(r) = rows
            .iter()
            .filter(|r| r.variant == variant)
            .max_by_key(|r| r.shape.seq_len)
        else {
            continue;
        };
        s.push_str(&format!(
            "\nTarget (issue #{issue}): the predicted peak of {step} at {} × {} at most {gib} GiB: {} ({} GiB; the bound {} GiB).\n",
            r.shape.micro_batch,
            r.shape.seq_len,
            if r.peak <= gib << 30 { "yes" } else { "no" },
            memory::gib(r.peak),
            memory::gib(r.bound),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        variant: Variant,
        b: usize,
        t: usize,
        layers: usize,
        vocab: usize,
        w: &dyn Fn(Phase, Shape) -> f64,
    ) -> Run {
        let settings = StepSettings {
            batch: b,
            seq_len: t,
            prompt_len: 1024,
            micro_batch: b,
            flash_attention: variant != Variant::NoFlash,
            vocab_chunk: (variant != Variant::NoVocabChunks).then_some(8192),
            checkpointing: variant != Variant::NoCheckpointing,
            compute: "f32".into(),
            layers,
            vocab,
            hidden: 64,
            intermediate: 128,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            tied: true,
            layer_by_hand: variant == Variant::LayerByHand,
        };
        let shape = Shape::of(&settings);
        let working = [Phase::Head, Phase::Layer(0), Phase::Embedding]
            .into_iter()
            .map(|k| (k, w(k, shape).round() as i64 + (vocab as i64 - 16384) * 3))
            .collect();
        Run {
            settings,
            variant,
            start: 0,
            params: 0,
            working,
            peak: (0, Phase::Head),
        }
    }

    /// A working set that follows the law (intercept, a slope in its tokens, three bytes a
    /// vocabulary row) is found again at another length and vocabulary; a saving's excess grows
    /// by its own term.
    #[test]
    fn the_laws_recover_a_linear_working_set_and_grow_a_savings_excess() {
        let law =
            |k: Phase, s: Shape| 1000.0 + if k == Phase::Head { 7.0 } else { 5.0 } * s.tokens(k);
        let excess = |k: Phase, s: Shape| {
            law(k, s)
                + if k == Phase::Layer(0) {
                    2.0 * (s.micro_batch * s.seq_len * s.seq_len) as f64
                } else {
                    0.0
                }
        };
        let runs = vec![
            run(Variant::AllSavings, 1, 1536, 1, 16384, &law),
            run(Variant::AllSavings, 1, 2048, 1, 16384, &law),
            run(Variant::AllSavings, 1, 2048, 1, 32768, &law),
            run(Variant::NoFlash, 1, 2048, 1, 16384, &excess),
        ];
        let model = Model::new(&runs);
        let target = SHAPES[1];
        for kind in [Phase::Head, Phase::Layer(0), Phase::Embedding] {
            let got = model
                .working(Variant::AllSavings, kind, target, 151936.0, 28.0)
                .expect("fitted");
            let want = law(kind, target) + 3.0 * (151936.0 - 16384.0);
            assert!(
                (got - want).abs() < 1e-6 * want,
                "{kind:?}: {got} against {want}"
            );
        }
        let got = model
            .working(Variant::NoFlash, Phase::Layer(0), target, 151936.0, 28.0)
            .expect("grown");
        let want = excess(Phase::Layer(0), target) + 3.0 * (151936.0 - 16384.0);
        assert!((got - want).abs() < 1e-6 * want, "{got} against {want}");
    }

    /// The 5-product backward's peak is all savings' with its scratch added to each layer's
    /// backward and nothing else: no scratch, the same peak; a scratch large enough to make a
    /// layer's backward the peak, exactly the scratch more for each byte more. The scratch at
    /// Qwen3-1.7B's 2 × 9,220 is dQ's f32 sums (151 MB) and 4,641 counters.
    #[test]
    fn the_five_product_backward_adds_its_scratch_to_each_layers_backward() {
        assert_eq!(
            crate::perf::flash_predict::five_product_scratch(2, 16, 128, 9220),
            2 * 16 * 9220 * 128 * 4 + (2 * 16 * 145 + 1) * 4
        );
        let law = |_: Phase, s: Shape| 1000.0 + 5.0 * s.tokens(Phase::Layer(0));
        let runs = vec![
            run(Variant::AllSavings, 1, 1536, 1, 16384, &law),
            run(Variant::AllSavings, 1, 2048, 1, 16384, &law),
        ];
        let model = Model::new(&runs);
        let cfg = settings_config(&runs[0].settings).expect("config");
        let shape = SHAPES[1];
        let sizes = Sizes::of(&cfg, shape.micro_batch, shape.seq_len, 2);
        let peak = |v: Variant, layer_scratch: u64| {
            let (got, at, _) = model
                .peak(
                    v,
                    shape,
                    &Sizes {
                        layer_scratch,
                        ..sizes
                    },
                    0.5,
                )
                .expect("the traces of all savings stand for both");
            (got, at)
        };
        assert_eq!(peak(Variant::FiveProducts, 0), peak(Variant::AllSavings, 0));
        let (one, at_one) = peak(Variant::FiveProducts, 1 << 40);
        let (two, at_two) = peak(Variant::FiveProducts, 2 << 40);
        assert!(matches!(at_one, Phase::Layer(_)), "{at_one:?}");
        assert_eq!(at_one, at_two);
        assert_eq!(two - one, (1u64 << 40) as f64);
    }

    /// The by-hand step is fitted from its own traces: its constant, its slope in the tokens and
    /// its vocabulary term, which differ from all savings'. Without a by-hand run at a second
    /// vocabulary only the head (the same code either way) takes all savings' term, and the
    /// other phases are not predicted. A run with a saving off and the layers by hand stands for
    /// no variant.
    #[test]
    fn the_by_hand_step_has_its_own_laws_and_vocabulary_term() {
        let law = |k: Phase, s: Shape| 1000.0 + 5.0 * s.tokens(k);
        let by_hand = |k: Phase, s: Shape| 400.0 + 3.0 * s.tokens(k);
        let mut runs = vec![
            run(Variant::AllSavings, 1, 1536, 1, 16384, &law),
            run(Variant::AllSavings, 1, 2048, 1, 16384, &law),
            run(Variant::AllSavings, 1, 2048, 1, 32768, &law),
            run(Variant::LayerByHand, 1, 1536, 1, 16384, &by_hand),
            run(Variant::LayerByHand, 1, 2048, 1, 16384, &by_hand),
        ];
        let target = SHAPES[1];
        let at = |runs: &[Run], kind: Phase| {
            Model::new(runs).working(Variant::LayerByHand, kind, target, 151936.0, 28.0)
        };
        // one vocabulary: the head borrows all savings' 3 bytes a row, the rest is unknown
        let head = at(&runs, Phase::Head).expect("the head borrows");
        let want = by_hand(Phase::Head, target) + 3.0 * (151936.0 - 16384.0);
        assert!((head - want).abs() < 1e-6 * want, "{head} against {want}");
        assert_eq!(at(&runs, Phase::Embedding), None);
        assert_eq!(at(&runs, Phase::Layer(0)), None);
        // a by-hand run at 32,768 rows, 1 byte a row more than at 16,384 (the fixture's 3 less 2)
        let mut wide = run(Variant::LayerByHand, 1, 2048, 1, 32768, &by_hand);
        for (_, w) in &mut wide.working {
            *w -= 2 * (32768 - 16384);
        }
        runs.push(wide);
        for kind in [Phase::Head, Phase::Layer(0), Phase::Embedding] {
            let got = at(&runs, kind).expect("fitted");
            let want = by_hand(kind, target) + (151936.0 - 16384.0);
            assert!(
                (got - want).abs() < 1e-6 * want,
                "{kind:?}: {got} against {want}"
            );
        }
        let mut mixed = runs[3].settings.clone();
        assert_eq!(Variant::of(&mixed), Some(Variant::LayerByHand));
        mixed.checkpointing = false;
        assert_eq!(Variant::of(&mixed), None);
        mixed.layer_by_hand = false;
        assert_eq!(Variant::of(&mixed), Some(Variant::NoCheckpointing));
    }
}
