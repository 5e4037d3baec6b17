//! Memory arithmetic of training (issue #19): what the paper runs need on one GPU. The device's
//! own readings (the meter and the per-phase trace) are [`crate::device`]'s.
//!
//! [`plan`] is the arithmetic behind docs/CUDA.md's table of the paper runs. It gives the bytes
//! per parameter of training with fp32 masters, and an activation model of the GPU path (flash
//! attention, per-layer checkpointing, vocabulary chunks). It is an estimate; `acpo bench
//! train-step` measures.

use std::path::Path;

use serde::Serialize;

use crate::manifest::Experiment;
use crate::model::QwenConfig;
use crate::report::table::{Align::Left, Align::Right, Table};

/// Bytes per parameter of a trained model with fp32 masters and AdamW: master (4), the compute
/// copy the forward reads (2 in bf16, none in f32), the fp32 gradient (4), and the two fp32
/// moments (8).
pub fn state_bytes_per_param(bf16: bool) -> u64 {
    4 + if bf16 { 2 } else { 0 } + 4 + 8
}

/// Bytes per parameter a trained model holds on the device while its run samples: the state of
/// [`state_bytes_per_param`] less the gradient (summed within a step, dropped after its update):
/// the master, the compute copy and the two moments. The sampler's pool takes half of what
/// that leaves (`rollout::PagedOptions`).
pub fn resident_bytes_per_param(bf16: bool) -> u64 {
    state_bytes_per_param(bf16) - 4
}

/// Bytes a run's trainer keeps on the device while it samples: the policy's, and a critic's
/// where it has one, at [`resident_bytes_per_param`] (bf16 compute, fp32 masters).
pub fn resident_while_sampling(cfg: &QwenConfig, critic: bool) -> u64 {
    let trained = parameters(cfg, false) + if critic { parameters(cfg, true) } else { 0 };
    trained * resident_bytes_per_param(true)
}

/// The training memory of one model of one paper run on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct ModelMemory {
    pub parameters: u64,
    /// Weights, masters, gradients and optimizer state.
    pub state: u64,
    /// Activations of one micro-batch with flash attention, checkpointing and vocab chunks.
    pub activations: u64,
    /// The same without checkpointing (every layer's activations kept).
    pub activations_no_checkpointing: u64,
    /// The same without flash attention (scores and probabilities `(b, H, T, T)` per layer).
    pub activations_no_flash: u64,
}

/// A paper run's memory on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct RunMemory {
    pub run: String,
    pub micro_batch: usize,
    pub seq_len: usize,
    pub policy: ModelMemory,
    pub critic: Option<ModelMemory>,
    /// Policy + critic, with every memory saving on.
    pub total: u64,
}

/// Parameters of a Qwen2/Qwen3 config (the shapes `model::init` writes). With a value head:
/// the backbone and `score` (H + 1), no lm_head (a token-classification model, as verl's
/// critic is).
pub fn parameters(cfg: &QwenConfig, value_head: bool) -> u64 {
    let h = cfg.hidden_size as u64;
    crate::model::init::layout(cfg)
        .iter()
        .filter(|(name, _, _)| !(value_head && name == "lm_head.weight"))
        .map(|(_, shape, _)| shape.iter().product::<usize>() as u64)
        .sum::<u64>()
        + if value_head { h + 1 } else { 0 }
}

/// Activation bytes of one micro-batch of `b` sequences of `t` tokens in bf16, the model this
/// crate's GPU path follows:
/// - checkpointing keeps each layer's input (b·t·H) and recomputes one layer at a time. A layer
///   holds about 6·H + 4·I values per token: the normed inputs, q/k/v and the attention output,
///   gate, up and their SwiGLU product, and the residual sums.
/// - without flash attention, a layer also keeps its scores and probabilities `(b, nh, t, t)`.
/// - the vocabulary end holds about four `(b·t, chunk)` f32 temporaries (logits, exponentials,
///   probabilities, their gradient); a critic's value head holds nothing of that size.
fn activations(
    cfg: &QwenConfig,
    b: u64,
    t: u64,
    checkpointing: bool,
    flash: bool,
    lm: bool,
) -> u64 {
    let (h, i, l) = (
        cfg.hidden_size as u64,
        cfg.intermediate_size as u64,
        cfg.num_hidden_layers as u64,
    );
    let tokens = b * t;
    let layer = 2 * tokens * (6 * h + 4 * i)
        + if flash {
            0
        } else {
            2 * 2 * b * cfg.num_attention_heads as u64 * t * t
        };
    let layers = if checkpointing {
        2 * tokens * h * l + layer
    } else {
        layer * l
    };
    let vocab = if lm {
        4 * 4 * tokens * crate::model::qwen::VOCAB_CHUNK as u64
    } else {
        0
    };
    layers + vocab
}

/// The tensors a train step of one micro-batch of `b` sequences of `t` tokens holds at its
/// peak, by arithmetic, named: what a measured trace (`acpo bench train-step --trace`) is read
/// against. The state (masters, moments, the compute copy, the gradients) is exact; the rest
/// follows `activations`' model.
pub fn step_tensors(
    cfg: &QwenConfig,
    b: u64,
    t: u64,
    bf16: bool,
    checkpointing: bool,
    flash: bool,
    vocab_chunks: bool,
) -> Vec<(&'static str, u64)> {
    let n = parameters(cfg, false);
    let (h, l) = (cfg.hidden_size as u64, cfg.num_hidden_layers as u64);
    let mut out = vec![
        ("fp32 masters", 4 * n),
        ("AdamW moments (fp32)", 8 * n),
        ("fp32 gradients", 4 * n),
    ];
    if bf16 {
        out.push(("bf16 compute copy of the weights", 2 * n));
    }
    let all = activations(cfg, b, t, checkpointing, flash, true);
    let vocab = activations(cfg, b, t, checkpointing, flash, true)
        - activations(cfg, b, t, checkpointing, flash, false);
    if checkpointing {
        let inputs = 2 * b * t * h * l;
        out.push(("every layer's input (checkpointing)", inputs));
        out.push(("one layer's activations (recompute)", all - vocab - inputs));
    } else {
        out.push(("every layer's activations", all - vocab));
    }
    if vocab_chunks {
        out.push(("vocabulary-chunk temporaries", vocab));
    }
    out
}

fn model_memory(cfg: &QwenConfig, b: u64, t: u64, bf16: bool, critic: bool) -> ModelMemory {
    let parameters = parameters(cfg, critic);
    ModelMemory {
        parameters,
        state: parameters * state_bytes_per_param(bf16),
        activations: activations(cfg, b, t, true, true, !critic),
        activations_no_checkpointing: activations(cfg, b, t, false, true, !critic),
        activations_no_flash: activations(cfg, b, t, true, false, !critic),
    }
}

/// The memory of each run of `manifests` (their model configs read from `configs`, named by the
/// manifest's hub repo: `Qwen/Qwen3-1.7B` → `qwen3-1.7b.json`).
pub fn plan(manifests: &[Experiment], configs: &Path) -> crate::model::Result<Vec<RunMemory>> {
    let mut out = Vec::new();
    for exp in manifests {
        let cfg = model_config(exp, configs)?;
        let bf16 = exp.model.dtype == crate::model::spec::DType::Bf16;
        let t = (exp.data.max_prompt_length + exp.data.max_response_length) as u64;
        let b = exp.actor.micro_batch_size as u64;
        let policy = model_memory(&cfg, b, t, bf16, false);
        // The critic trains with the actor's micro-batches (`UpdatePlan`).
        let critic = exp
            .critic
            .as_ref()
            .map(|_| model_memory(&cfg, b, t, bf16, true));
        // The actor's and the critic's passes run one after the other: their activations are
        // never alive together, their states always are.
        let total = policy.state
            + critic.as_ref().map_or(0, |c| c.state)
            + policy
                .activations
                .max(critic.as_ref().map_or(0, |c| c.activations));
        out.push(RunMemory {
            run: exp.name.clone(),
            micro_batch: b as usize,
            seq_len: t as usize,
            policy,
            critic,
            total,
        });
    }
    Ok(out)
}

/// GiB with one decimal.
pub fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// The usable memory of one 80 GB H100 (what the device reports free to a process).
pub const H100_USABLE_GIB: f64 = 78.0;

/// The plan as a Markdown table.
pub fn plan_markdown(rows: &[RunMemory]) -> String {
    let mut t = Table::new([
        ("run", Left),
        ("micro-batch × tokens", Left),
        ("policy params", Right),
        ("policy state", Right),
        ("critic state", Right),
        ("activations (all savings)", Right),
        ("no checkpointing", Right),
        ("no flash", Right),
        ("total", Right),
        ("fits one 80 GB H100", Left),
    ]);
    for r in rows {
        let critic = r.critic.as_ref();
        let act = |f: fn(&ModelMemory) -> u64| gib(f(&r.policy).max(critic.map_or(0, f)));
        let fits = r.total as f64 / (1u64 << 30) as f64 <= H100_USABLE_GIB;
        t.row([
            r.run.clone(),
            format!("{} × {}", r.micro_batch, r.seq_len),
            format!("{:.2} B", r.policy.parameters as f64 / 1e9),
            gib(r.policy.state),
            critic.map_or_else(|| "—".into(), |c| gib(c.state)),
            act(|m| m.activations),
            act(|m| m.activations_no_checkpointing),
            act(|m| m.activations_no_flash),
            gib(r.total),
            if fits { "yes" } else { "no: verl (FSDP)" }.into(),
        ]);
    }
    let mut s = t.to_string();
    s.push_str(&format!(
        "\nGiB = 2^30 bytes. State = {} bytes per parameter (fp32 master, bf16 compute copy, fp32 gradient, two fp32 AdamW moments). Activations are estimates for one micro-batch (`perf::memory`); the larger of the actor's and the critic's, which never run together. An H100 offers about {H100_USABLE_GIB} GiB to a process.\n",
        state_bytes_per_param(true)
    ));
    s
}

/// The model config of a manifest, from `configs` by its model's name (`qwen3-1.7b.json`).
pub fn model_config(exp: &Experiment, configs: &Path) -> crate::model::Result<QwenConfig> {
    let file = exp.model.source.label().to_lowercase();
    QwenConfig::load(&configs.join(format!("{file}.json")))
}
