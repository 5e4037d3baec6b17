//! Batched sampling with a KV cache: rollouts for training and samples for evaluation.
//!
//! Prompts are left-padded to a common length; each sequence gets its own positions and a
//! key-padding mask, so its tokens are exactly what it would get alone. A finished sequence's
//! place goes to a waiting prompt, or it leaves the batch (and the cache) as soon as it stops.
//!
//! Randomness: sample i of prompt p at training step s draws from its own [`SplitMix64`] stream
//! keyed by (seed, step, p, i), one uniform per generated token, so a completion does not depend
//! on batch composition, batch order or crate versions.
//!
//! The returned log-probabilities are log softmax(logits / T) of the chosen tokens under the
//! *untruncated* distribution (the policy's, as the trainer recomputes them); top-k / top-p only
//! decide which token is drawn.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::model::qwen::{KvCache, Qwen};

mod paged;
mod sample;
use crate::model::Result;
use crate::rng::SplitMix64;
pub use paged::{paged_schedule, PagedOptions, PagedSchedule, PREFILL_TOKENS};
pub use sample::{argmax, sample_rows, sample_token};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
    pub max_new_tokens: usize,
}

/// The smallest sampling temperature other than 0 (greedy): logits / T overflows f32 below it.
pub const MIN_TEMPERATURE: f64 = 0.01;

/// A sampling temperature: 0 (greedy), or at least [`MIN_TEMPERATURE`], and finite (issue #47:
/// `inf` flattened every distribution to uniform without a word). The manifests, `acpo
/// generate`'s flags and [`SamplingParams::check`] hold this one rule.
pub fn temperature_range() -> crate::flags::Real {
    crate::flags::Real::within(MIN_TEMPERATURE..=f64::MAX).or_zero("greedy")
}

/// Nucleus sampling's `top_p`: the share of probability kept, in (0, 1].
pub fn top_p_range() -> crate::flags::Real {
    crate::flags::Real::above(0.0, 1.0)
}

impl SamplingParams {
    /// Whether these settings describe a distribution to draw from: the temperature in
    /// [`temperature_range`], `top_p` in [`top_p_range`], `top_k` at least 1 (the manifests'
    /// and `acpo generate`'s rules, for callers of the library).
    pub fn check(&self) -> std::result::Result<(), String> {
        let (t, p) = (temperature_range(), top_p_range());
        if !t.holds(self.temperature) {
            return Err(format!(
                "temperature must be {}, got {}",
                t.describe(),
                self.temperature
            ));
        }
        if !p.holds(self.top_p) {
            return Err(format!(
                "top_p must be {}, got {}",
                p.describe(),
                self.top_p
            ));
        }
        if self.top_k == Some(0) {
            return Err("top_k must be at least 1 (or none)".into());
        }
        Ok(())
    }

    /// Whether a draw over `vocab` tokens is from the whole distribution (no top-k, no top-p).
    pub fn full(&self, vocab: usize) -> bool {
        self.top_k.is_none_or(|k| k >= vocab) && self.top_p >= 1.0
    }
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// Produced an end-of-sequence token (kept as the last token).
    Eos,
    /// The decoded text contains a stop string.
    Stop,
    /// Reached `max_new_tokens`.
    Length,
}

/// Turns generated token ids into text (for stop strings).
pub type Decoder<'a> = &'a (dyn Fn(&[u32]) -> String + Sync);

/// When to stop besides the length limit.
#[derive(Default)]
pub struct StopCriteria<'a> {
    pub eos_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    /// Decodes generated ids to text (needed for stop strings).
    pub decode: Option<Decoder<'a>>,
}

/// Everything a sampler call needs besides its prompts and random keys: how to sample, when to
/// stop and which token pads. Training, the probe, evaluation, `acpo generate` and the
/// benchmarks all describe their sampling with it.
pub struct SampleRequest<'a> {
    pub params: SamplingParams,
    pub stop: StopCriteria<'a>,
    pub pad_id: u32,
    /// Sequences decoded at once (continuous batching): when one finishes, a waiting prompt
    /// takes its place. None: every prompt at once.
    pub max_batch: Option<usize>,
    /// Per prompt, at most this many new tokens (below `params.max_new_tokens`; at least one is
    /// always drawn); None: the params' limit for all.
    pub limits: Option<Vec<usize>>,
    /// Where the engine adds what its prefills and decode steps took ([`GenStats`]).
    pub stats: Option<&'a std::sync::Mutex<GenStats>>,
    /// Decode over a paged KV cache ([`PagedOptions`]) instead of the dense one.
    pub paged: Option<PagedOptions>,
}

/// What a sampler call did: seconds and tokens of its prefills, and of its decode steps (each
/// drawing and appending one token per sequence).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenStats {
    pub prefill_seconds: f64,
    /// Prompt tokens prefilled (padding not counted).
    pub prefill_tokens: usize,
    pub decode_seconds: f64,
    /// Of `decode_seconds`, the seconds the host waited for the device to hand back what it drew
    /// (the read-back of each step's tokens, or of its logits for a draw on the host). The rest
    /// is the host's own: issuing the step's launches and its bookkeeping. Where the device
    /// bounds a step the host waits for most of it; where the host's launches do, for little
    /// ([`GenStats::host_share`]). On the CPU nothing is queued, so nearly nothing.
    pub decode_wait_seconds: f64,
    /// Tokens drawn.
    pub decode_tokens: usize,
    /// Decode steps run (each appending a token to every row that goes on): what a decode
    /// roofline charges the weights' reads by.
    pub decode_steps: usize,
    /// Key positions the decode steps attended over, each row its own (its prompt and the
    /// tokens it has so far, the one it feeds included; padding not counted), summed over the
    /// steps: what a decode roofline charges the KV cache's reads by. A row the paged engine
    /// preempts and recomputes counts again; a finished row of the dense engine decoding one
    /// discarded token while a prompt joins in its place does not (work no schedule needs).
    pub decode_positions: usize,
    /// The most rows one decode step took: the batch `max_batch`, or a paged cache's pool,
    /// allowed.
    pub most_rows: usize,
    /// The most positions one prefill call took: its rows × their left-padded width (a paged
    /// cache's [`PagedOptions::prefill_tokens`] bounds it).
    pub widest_prefill: usize,
    /// Prompts the dense engine prefilled into the places of finished sequences, writing only
    /// their own rows of the cache (`KvCache::place_row`).
    pub joined_in_place: usize,
    /// Times the dense engine copied its batch's cache to change the batch's rows: finished
    /// sequences leaving ([`KvCache::select_rows`]) or prompts appended
    /// ([`KvCache::append_rows`]), or dropping the columns no row reads any more to make room
    /// for a step (`KvCache::drop_front`); each a pass over every kept row's buffers.
    pub cache_moves: usize,
    /// Of `cache_moves`, the dense engine's copies to make room for a step: the columns no row
    /// reads any more dropped (or, where fewer than 8 leading columns are unread, the buffers
    /// widened).
    pub front_drops: usize,
    /// The most columns a row of the dense engine's cache had room for after a decode step: with
    /// the batch's rows, what its buffers took.
    pub widest_cache: usize,
}

impl GenStats {
    /// The share of the decode time the host did not spend waiting for the device's draws
    /// (`1 − decode_wait_seconds / decode_seconds`): near 1, a decode step is as slow as the
    /// host issues it, whatever its kernels take; low, the kernels bound it. None before any
    /// decode time.
    pub fn host_share(&self) -> Option<f64> {
        (self.decode_seconds > 0.0)
            .then(|| (1.0 - self.decode_wait_seconds / self.decode_seconds).clamp(0.0, 1.0))
    }
}

/// How a sampler holds its KV cache: a manifest's `kv_layout` (training's rollouts, the probe
/// and its evaluations), `acpo eval --paged-kv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvLayout {
    /// A buffer per sequence at its full length ([`generate`]'s dense engine): on a GPU as many
    /// sequences at once as [`device_slots`] says, every one reserving its longest response.
    #[default]
    Dense,
    /// Blocks from one pool, taken as the sequences grow ([`PagedOptions`]): on a GPU one call
    /// takes all of a request's prompts, as many decoding at once as the pool holds at their
    /// real lengths, a group's identical prompts prefilled once; on the CPU the dense engine's
    /// calls and completions, bit for bit.
    Paged,
}

impl KvLayout {
    /// `request` sampling `prompts` of at most `longest` tokens on `model` this way: the dense
    /// engine capped at [`device_slots`] (None on the CPU: every prompt at once), or the paged
    /// engine with its defaults, the pool bounding how many decode at once.
    pub fn request<'a>(
        self,
        request: SampleRequest<'a>,
        model: &Qwen,
        longest: usize,
    ) -> SampleRequest<'a> {
        match self {
            KvLayout::Dense => {
                let positions = longest + request.params.max_new_tokens;
                match device_slots(model, positions) {
                    Some(slots) => request.max_batch(slots),
                    None => request,
                }
            }
            KvLayout::Paged => request.paged(PagedOptions::default()),
        }
    }
}

/// Sequences to decode at once on `model`'s device (issue #34): on CUDA, as many as half the
/// device's free memory holds at `positions` cached positions each, and the eighth more a row's
/// buffers can take after the dense engine drops the columns no row reads (the KV cache in the
/// bytes it takes there, [`Qwen::kv_elem_bytes`], and a row of logits and its sampling
/// temporaries); the other half stays for the cache's copies (each a layer at a time: finished
/// rows leaving, prompts merged, the columns no row reads dropped) and a step's activations. At
/// least 1. None on the CPU, which keeps its batching (every shipped result was sampled that
/// way).
pub fn device_slots(model: &Qwen, positions: usize) -> Option<usize> {
    let device = model.device();
    if !device.is_cuda() {
        return None;
    }
    let free = crate::device::PeakMeter::new(device).free()?;
    let cfg = model.config();
    // the widest a row's buffers get: its positions, the eighth left free after a drop and the
    // columns a drop leaves (`with_room`)
    let columns = positions + positions / 8 + DROP_GROUP;
    let per_row = cfg.kv_bytes_per_position(model.kv_elem_bytes()) * columns + 16 * cfg.vocab_size;
    Some(((free / 2) as usize / per_row.max(1)).max(1))
}

impl<'a> SampleRequest<'a> {
    /// Sampling with `params`, stopping at the length limit only, padding with token 0.
    /// Prompt `i`'s limit on new tokens: its own where the request has them (at least one, at
    /// most the params'), else the params'.
    fn limit(&self, i: usize) -> usize {
        self.limits
            .as_ref()
            .map_or(self.params.max_new_tokens, |l| {
                l[i].min(self.params.max_new_tokens).max(1)
            })
    }

    pub fn new(params: SamplingParams) -> SampleRequest<'a> {
        SampleRequest {
            params,
            stop: StopCriteria::default(),
            pad_id: 0,
            max_batch: None,
            limits: None,
            stats: None,
            paged: None,
        }
    }

    /// Decode over a paged KV cache sized and read as `opts` says.
    pub fn paged(mut self, opts: PagedOptions) -> SampleRequest<'a> {
        self.paged = Some(opts);
        self
    }

    /// Add what the engine's prefills and decode steps take to `stats`.
    pub fn stats(mut self, stats: &'a std::sync::Mutex<GenStats>) -> SampleRequest<'a> {
        self.stats = Some(stats);
        self
    }

    /// Prompt i gets at most `limits[i]` new tokens (capped by the params' limit).
    pub fn limits(mut self, limits: Vec<usize>) -> SampleRequest<'a> {
        self.limits = Some(limits);
        self
    }

    /// Decode at most `n` sequences at once; a waiting prompt takes a finished one's place.
    pub fn max_batch(mut self, n: usize) -> SampleRequest<'a> {
        self.max_batch = Some(n.max(1));
        self
    }

    /// Also stop at any of these end-of-sequence tokens.
    pub fn eos(mut self, eos_ids: Vec<u32>) -> SampleRequest<'a> {
        self.stop.eos_ids = eos_ids;
        self
    }

    /// Left-pad prompts with this token.
    pub fn pad(mut self, pad_id: u32) -> SampleRequest<'a> {
        self.pad_id = pad_id;
        self
    }

    /// Also stop when the decoded text contains one of `strings`.
    pub fn stop_strings(mut self, strings: Vec<String>, decode: Decoder<'a>) -> SampleRequest<'a> {
        self.stop.stop_strings = strings;
        self.stop.decode = Some(decode);
        self
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    pub tokens: Vec<u32>,
    /// log π(token) under softmax(logits / T) (T = 1 when greedy); one per token.
    pub log_probs: Vec<f32>,
    pub finish: FinishReason,
}

impl Completion {
    /// Nothing drawn yet.
    fn empty() -> Completion {
        Completion {
            tokens: Vec::new(),
            log_probs: Vec::new(),
            finish: FinishReason::Length,
        }
    }
}

/// Where sample randomness comes from: (seed, step, prompt index, sample index).
pub type SampleKey = [u64; 4];

/// Samples one completion per prompt. `prompts[i]` is drawn with the stream `keys[i]`.
/// `model` should be detached (`Qwen::new(.., true)`: no autograd graph).
///
/// The request is one batch on every device and with any number of threads: a completion's
/// logits depend in their last bits on the batch it is decoded in (the left padding to the
/// batch's longest prompt, the row count that picks a product's kernel), so a batch cut by the
/// thread count made a run's samples, and from the first near tie its whole trajectory, depend
/// on the threads (issue #48). The threads go to the ops inside the batch instead, whose results
/// do not depend on how they are split (docs/PERFORMANCE.md, "Threads").
pub fn generate(
    model: &Qwen,
    prompts: &[Vec<u32>],
    keys: &[SampleKey],
    request: &SampleRequest,
) -> Result<Vec<Completion>> {
    check_request(prompts, keys, request)?;
    match request.paged {
        Some(opts) => paged::decode_all_paged(model, prompts, keys, request, opts),
        None => decode_all(model, prompts, keys, request),
    }
}

/// A batch being decoded: row r is prompt `active[r]`, its keys valid where `valid[r]` is 1.
struct Batch {
    active: Vec<usize>,
    valid: Vec<Vec<u8>>,
    cache: KvCache,
    /// `(rows, V)` in the model's dtype ([`Qwen::sampling_logits`]): the logits the next token
    /// of each row is drawn from.
    logits: Tensor,
}

/// Prefills `rows` (prompt indices) as one left-padded batch, reserving room for `reserve`
/// new tokens in the KV cache.
fn prefill(
    model: &Qwen,
    prompts: &[Vec<u32>],
    rows: Vec<usize>,
    pad_id: u32,
    reserve: usize,
) -> Result<Batch> {
    let device = model.device();
    let longest = rows.iter().map(|&i| prompts[i].len()).max().unwrap_or(0);
    let (mut ids, mut positions) = (Vec::new(), Vec::new());
    let mut valid = Vec::with_capacity(rows.len());
    for &i in &rows {
        let p = &prompts[i];
        let pad = longest - p.len();
        ids.extend(std::iter::repeat_n(pad_id, pad).chain(p.iter().copied()));
        positions.extend((0..longest).map(|j| j.saturating_sub(pad) as u32));
        valid.push((0..longest).map(|j| u8::from(j >= pad)).collect());
    }
    let b = rows.len();
    let ids = Tensor::from_vec(ids, (b, longest), device)?;
    let pos = Tensor::from_vec(positions, (b, longest), device)?;
    let reserved = KvCache::with_reserve(reserve);
    let (hidden, cache) =
        model.forward_hidden(&ids, &pos, &mask_tensor(&valid, device)?, Some(&reserved))?;
    Ok(Batch {
        active: rows,
        valid,
        cache,
        logits: last_logits(model, &hidden)?,
    })
}

/// The sampling engine behind [`generate`]. Up to `max_batch` sequences decode
/// together, one token per step, over a KV cache written in place ([`KvCache`]). While prompts
/// wait, they are prefilled together and take the places of the sequences that finished:
/// written into those rows of the cache, right-aligned to the batch's columns
/// ([`KvCache::place_row`]), so that no other row's keys move; the finished rows decode one
/// last, discarded token meanwhile. Where a joining prompt is longer than the batch's history
/// (with the step's column), or fewer prompts wait than rows finished, the finished sequences
/// leave the batch ([`KvCache::select_rows`], a copy of the rows kept) and the joining ones are
/// appended ([`KvCache::append_rows`], a copy of all). A completion depends only on its prompt and its key: each prompt draws from its own
/// RNG, and attention masks every column that is not its own.
fn decode_all(
    model: &Qwen,
    prompts: &[Vec<u32>],
    keys: &[SampleKey],
    request: &SampleRequest,
) -> Result<Vec<Completion>> {
    let mut out: Vec<Completion> = prompts.iter().map(|_| Completion::empty()).collect();
    if prompts.is_empty() || request.params.max_new_tokens == 0 {
        return Ok(out);
    }
    let mut rngs: Vec<SplitMix64> = keys.iter().map(|k| SplitMix64::from_key(k)).collect();
    let slots = request.max_batch.unwrap_or(prompts.len()).max(1);
    let mut waiting: std::collections::VecDeque<usize> = (0..prompts.len()).collect();
    let first: Vec<usize> = waiting.drain(..slots.min(prompts.len())).collect();
    // what was queued before the call (the caller's work) is not the call's
    settle(model, request)?;
    let started = std::time::Instant::now();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut engine = Dense {
        model,
        prompts,
        request,
        next_pos: prompts.iter().map(|p| p.len() as u32).collect(),
        timed: GenStats::default(),
        slack: ((longest + request.params.max_new_tokens) / 8).max(1),
    };
    let mut batch = engine.prefill(first, request.params.max_new_tokens)?;
    loop {
        let (keep, next_ids) = draw(
            &batch.logits,
            &batch.active,
            &mut rngs,
            &mut out,
            request,
            &mut engine.timed,
        )?;
        let finished = batch.active.len() - keep.len();
        let joining: Vec<usize> = waiting.drain(..finished.min(waiting.len())).collect();
        if keep.is_empty() && joining.is_empty() {
            break;
        }
        batch = engine.advance(batch, &keep, next_ids, joining)?;
    }
    if let Some(stats) = request.stats {
        let timed = &engine.timed;
        let decode_seconds = started.elapsed().as_secs_f64() - timed.prefill_seconds;
        add_stats(stats, timed, decode_seconds, &out);
    }
    Ok(out)
}

/// The dense engine through one [`decode_all`] call: what it samples, each prompt's next
/// position, and what it has timed and counted.
struct Dense<'a> {
    model: &'a Qwen,
    prompts: &'a [Vec<u32>],
    request: &'a SampleRequest<'a>,
    next_pos: Vec<u32>,
    timed: GenStats,
    /// The columns free after the cache drops its front ([`with_room`]): an eighth of the
    /// longest prompt and response.
    slack: usize,
}

impl Dense<'_> {
    /// A prefill of the prompts `rows`, timed (on a GPU, until its work is done) and counted,
    /// its cache with room for `reserve` new positions.
    fn prefill(&mut self, rows: Vec<usize>, reserve: usize) -> Result<Batch> {
        let (model, request, timed) = (self.model, self.request, &mut self.timed);
        // the decode step queued before a joining prefill: waited for as decode time
        timed.decode_wait_seconds += settle(model, request)?;
        let t = std::time::Instant::now();
        timed.prefill_tokens += rows.iter().map(|&i| self.prompts[i].len()).sum::<usize>();
        let b = prefill(model, self.prompts, rows, request.pad_id, reserve)?;
        let width = b.valid.first().map_or(0, Vec::len);
        timed.widest_prefill = timed.widest_prefill.max(b.active.len() * width);
        settle(model, request)?;
        timed.prefill_seconds += t.elapsed().as_secs_f64();
        Ok(b)
    }

    /// The batch the next draw reads, after a draw that kept the rows `keep` of `batch`
    /// (feeding `next_ids`): the rows kept decode one token, and the prompts `joining` take the
    /// finished rows' places, in place when one joins for each and the longest, right-aligned
    /// to end at the column the step writes, starts within the batch's columns.
    fn advance(
        &mut self,
        batch: Batch,
        keep: &[usize],
        next_ids: Vec<u32>,
        joining: Vec<usize>,
    ) -> Result<Batch> {
        let finished = batch.active.len() - keep.len();
        let longest = joining.iter().map(|&i| self.prompts[i].len()).max();
        let in_place = !keep.is_empty()
            && finished > 0
            && joining.len() == finished
            && longest <= Some(batch.cache.len() + 1);
        // The sequences that go on decode one token.
        let next = if keep.is_empty() {
            None
        } else {
            self.timed.decode_steps += 1;
            self.timed.decode_positions += keep
                .iter()
                .map(|&r| self.next_pos[batch.active[r]] as usize + 1)
                .sum::<usize>();
            let finished_rows = match in_place {
                true => Finished::Stay(self.request.pad_id),
                false => Finished::Leave,
            };
            self.timed.cache_moves += usize::from(!in_place && finished > 0);
            let device = self.model.device();
            let (batch, feed, live) = feed_rows(
                batch,
                keep,
                &next_ids,
                finished_rows,
                &mut self.next_pos,
                device,
            )?;
            // the joiners' columns end at the step's: all but one of them stay
            let stay = match in_place {
                true => longest.unwrap_or(1) - 1,
                false => 0,
            };
            let (batch, moved) = with_room(batch, &live, stay, self.slack)?;
            self.timed.cache_moves += usize::from(moved);
            self.timed.front_drops += usize::from(moved);
            self.timed.most_rows = self.timed.most_rows.max(batch.active.len());
            let batch = decode(self.model, batch, &feed)?;
            let widest = self.timed.widest_cache.max(batch.cache.capacity());
            self.timed.widest_cache = widest;
            Some(batch)
        };
        // Waiting prompts take the finished sequences' places.
        Ok(match (next, joining.is_empty()) {
            (Some(b), true) => b,
            (Some(b), false) if in_place => {
                // staged in a cache of their own length: their rows are copied into the batch's
                let joined = self.prefill(joining, 0)?;
                let vacated: Vec<usize> = (0..b.active.len())
                    .filter(|r| keep.binary_search(r).is_err())
                    .collect();
                self.timed.joined_in_place += vacated.len();
                take_places(b, &vacated, joined)?
            }
            // merged (the batch's next full step makes room), or a new batch with the room its
            // responses take
            (Some(b), false) => {
                let joined = self.prefill(joining, 0)?;
                self.timed.cache_moves += 1;
                merge(b, joined)?
            }
            (None, _) => self.prefill(joining, self.request.params.max_new_tokens)?,
        })
    }
}

/// Draws each active row's next token (`logits` row r is prompt `active[r]`'s) into its
/// completion and ends the completions that stop: at an end-of-sequence token, a stop string or
/// the prompt's length limit. Returns the rows that go on and the tokens they feed next; the
/// time the host waited for the draws goes to `timed`.
fn draw(
    logits: &Tensor,
    active: &[usize],
    rngs: &mut [SplitMix64],
    out: &mut [Completion],
    request: &SampleRequest,
    timed: &mut GenStats,
) -> Result<(Vec<usize>, Vec<u32>)> {
    let (mut keep, mut next_ids) = (Vec::new(), Vec::new());
    let (drawn, waited) = sample::sample_rows_waiting(logits, active, rngs, &request.params)?;
    timed.decode_wait_seconds += waited;
    for (r, &i) in active.iter().enumerate() {
        let (token, lp) = drawn[r];
        let c = &mut out[i];
        c.tokens.push(token);
        c.log_probs.push(lp);
        if request.stop.eos_ids.contains(&token) {
            c.finish = FinishReason::Eos;
        } else if hits_stop_string(&c.tokens, &request.stop) {
            c.finish = FinishReason::Stop;
        } else if c.tokens.len() < request.limit(i) {
            keep.push(r);
            next_ids.push(token);
        }
    }
    Ok((keep, next_ids))
}

/// With stats asked for on a GPU, waits until the device has done what was queued, and says
/// how long that took (0 otherwise): a prefill's time is taken from an idle device to its work
/// done, so the decode step queued before it (which a join follows) counts as decode time, and
/// the wait for it as the host's wait; a call's time starts from an idle device.
fn settle(model: &Qwen, request: &SampleRequest) -> Result<f64> {
    if request.stats.is_some() && model.device().is_cuda() {
        let t = std::time::Instant::now();
        model.device().synchronize()?;
        return Ok(t.elapsed().as_secs_f64());
    }
    Ok(0.0)
}

/// One length limit (when the request has them) and one sample key per prompt, and no empty
/// prompt.
fn check_request(prompts: &[Vec<u32>], keys: &[SampleKey], request: &SampleRequest) -> Result<()> {
    // One of `what` per prompt.
    let one_each = |n: usize, what: &str| -> Result<()> {
        if n == prompts.len() {
            return Ok(());
        }
        let msg = format!("{} prompts but {n} {what}", prompts.len());
        Err(candle_core::Error::Msg(msg).into())
    };
    if let Some(limits) = &request.limits {
        one_each(limits.len(), "length limits")?;
    }
    one_each(keys.len(), "sample keys")?;
    if prompts.iter().any(Vec::is_empty) {
        return Err(candle_core::Error::Msg("cannot sample from an empty prompt".into()).into());
    }
    Ok(())
}

/// Adds a request's prefill timings and its decode time and tokens to the caller's totals.
fn add_stats(
    stats: &std::sync::Mutex<GenStats>,
    timed: &GenStats,
    decode_seconds: f64,
    out: &[Completion],
) {
    let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
    s.prefill_seconds += timed.prefill_seconds;
    s.prefill_tokens += timed.prefill_tokens;
    s.decode_seconds += decode_seconds;
    s.decode_wait_seconds += timed.decode_wait_seconds;
    s.decode_tokens += out.iter().map(|c| c.tokens.len()).sum::<usize>();
    s.decode_steps += timed.decode_steps;
    s.decode_positions += timed.decode_positions;
    s.most_rows = s.most_rows.max(timed.most_rows);
    s.widest_prefill = s.widest_prefill.max(timed.widest_prefill);
    s.joined_in_place += timed.joined_in_place;
    s.cache_moves += timed.cache_moves;
    s.front_drops += timed.front_drops;
    s.widest_cache = s.widest_cache.max(timed.widest_cache);
}

/// What a decode step does with the rows that finished at the draw before it.
enum Finished {
    /// They leave the batch, their cache rows too (a copy of the rows kept).
    Leave,
    /// They stay, feeding this token at position 0, their outputs discarded: prompts joining
    /// after the step take their rows ([`take_places`]).
    Stay(u32),
}

/// What each row of a decode step feeds: `(token, position)`.
type Feeds = Vec<(u32, u32)>;

/// The rows of a decode step of `batch` and what each feeds, `(token, position)`: the rows
/// `keep` (in order) feed their next tokens `next_ids` (advancing their prompts' positions);
/// the other rows, finished, leave (their cache rows too) or stay, feeding a pad token at
/// position 0. Returns the batch, the feeds, and the rows that go on.
fn feed_rows(
    mut batch: Batch,
    keep: &[usize],
    next_ids: &[u32],
    finished: Finished,
    next_pos: &mut [u32],
    device: &candle_core::Device,
) -> Result<(Batch, Feeds, Vec<usize>)> {
    let mut feed: Feeds = Vec::with_capacity(batch.active.len());
    let live = match finished {
        Finished::Leave => {
            if keep.len() < batch.active.len() {
                let rows = Tensor::from_vec(
                    keep.iter().map(|&r| r as u32).collect::<Vec<_>>(),
                    keep.len(),
                    device,
                )?;
                batch.cache = std::mem::take(&mut batch.cache).select_rows(&rows)?;
                batch.valid = keep.iter().map(|&r| batch.valid[r].clone()).collect();
                batch.active = keep.iter().map(|&r| batch.active[r]).collect();
            }
            for (&i, &id) in batch.active.iter().zip(next_ids) {
                feed.push((id, next_pos[i]));
                next_pos[i] += 1;
            }
            (0..batch.active.len()).collect()
        }
        Finished::Stay(pad_id) => {
            let mut ids = keep.iter().zip(next_ids).peekable();
            for (r, &i) in batch.active.iter().enumerate() {
                match ids.next_if(|(&k, _)| k == r) {
                    Some((_, &id)) => {
                        feed.push((id, next_pos[i]));
                        next_pos[i] += 1;
                    }
                    None => feed.push((pad_id, 0)),
                }
            }
            keep.to_vec()
        }
    };
    Ok((batch, feed, live))
}

/// One decode step: every row of `batch` feeds its `(token, position)` and appends a column.
fn decode(model: &Qwen, mut batch: Batch, feed: &[(u32, u32)]) -> Result<Batch> {
    let device = model.device();
    for row in &mut batch.valid {
        row.push(1);
    }
    let n = batch.active.len();
    let ids = Tensor::from_vec(feed.iter().map(|f| f.0).collect::<Vec<_>>(), (n, 1), device)?;
    let pos = Tensor::from_vec(feed.iter().map(|f| f.1).collect::<Vec<_>>(), (n, 1), device)?;
    let (hidden, cache) = model.forward_hidden(
        &ids,
        &pos,
        &mask_tensor(&batch.valid, device)?,
        Some(&batch.cache),
    )?;
    batch.cache = cache;
    batch.logits = last_logits(model, &hidden)?;
    Ok(batch)
}

/// A batch whose cache has room for one more column. Continuous batching appends a column for
/// every step of the batch, so its history outgrows any one sequence's; but a row reads only
/// from its first valid column on, and the oldest row decoding is at most its prompt and
/// response long. Where the buffers are full, the columns before the first valid column of
/// every row in `live` (the rows that go on) are dropped, but for the last `stay` columns
/// (where prompts joining after the step go, [`take_places`]), into buffers with `slack`
/// columns free after what is kept ([`KvCache::drop_front`]). With `slack` an eighth of the
/// longest prompt and response, that is a copy of the cache at most once in `slack` steps,
/// and buffers at most 9/8 of the longest prompt and response (and the [`DROP_GROUP`] less one
/// columns a drop leaves) after each drop (a merge widens them until the next:
/// [`KvCache::append_rows`] right-aligns to the longer history), where doubling the buffers
/// (what a full cache otherwise does) grew them without bound over a long call. The columns
/// dropped are masked for every row that goes on: on a GPU the decode kernels start at each
/// row's first valid column, so no result changes; on the CPU a masked column weighed ~1e-38 in
/// attention and no longer enters it, and the drop takes whole groups of 8 columns so that a
/// row's 8-lane sums keep their groups: in the tests the completions keep the bits of the paged
/// engine's gathered view, which drops nothing. Not always: the CPU picks a product's path by
/// its size (gemm's kernels, the one-block decode attention), so where the view and the
/// dropped buffers fall on two sides of a threshold, or a merge after a drop right-aligns them
/// differently, log-probs can move in their last bits.
fn with_room(mut batch: Batch, live: &[usize], stay: usize, slack: usize) -> Result<(Batch, bool)> {
    let (len, cap) = (batch.cache.len(), batch.cache.capacity());
    if len < cap || cap == 0 {
        return Ok((batch, false));
    }
    // a whole number of 8-column groups, so that the CPU's 8-lane sums over a row's columns
    // keep their groups (`fused::exp_kernel_avx2`): its bits stay those of the rows undropped
    let first = live
        .iter()
        .map(|&r| {
            let row = &batch.valid[r];
            row.iter().position(|&v| v == 1).unwrap_or(row.len())
        })
        .min()
        .unwrap_or(0)
        .min(len.saturating_sub(stay))
        / DROP_GROUP
        * DROP_GROUP;
    let capacity = len - first + slack.max(1);
    batch.cache = std::mem::take(&mut batch.cache).drop_front(first, capacity)?;
    for row in &mut batch.valid {
        row.drain(..first);
    }
    Ok((batch, true))
}

/// The columns a drop ([`with_room`]) takes are a multiple of this.
const DROP_GROUP: usize = 8;

/// `joined`'s rows written into the rows `vacated` of `batch` (in order), right-aligned to the
/// batch's history ([`KvCache::place_row`]): their keys, validity, prompts and logits; the
/// batch's other rows untouched.
fn take_places(mut batch: Batch, vacated: &[usize], joined: Batch) -> Result<Batch> {
    let len = batch.cache.len();
    batch.logits = batch.logits.contiguous()?;
    for (j, &r) in vacated.iter().enumerate() {
        batch.cache.place_row(r, &joined.cache, j)?;
        let mut valid = vec![0u8; len - joined.cache.len()];
        valid.extend(&joined.valid[j]);
        batch.valid[r] = valid;
        batch.active[r] = joined.active[j];
        batch
            .logits
            .slice_set(&joined.logits.narrow(0, j, 1)?.contiguous()?, 0, r)?;
    }
    Ok(batch)
}

/// The rows of `a`, then those of `b`, right-aligned to the longer history.
fn merge(a: Batch, b: Batch) -> Result<Batch> {
    let cache = a.cache.append_rows(&b.cache)?;
    let len = cache.len();
    let align = |rows: Vec<Vec<u8>>| {
        rows.into_iter().map(move |r| {
            let mut v = vec![0u8; len - r.len()];
            v.extend(r);
            v
        })
    };
    Ok(Batch {
        active: a.active.into_iter().chain(b.active).collect(),
        valid: align(a.valid).chain(align(b.valid)).collect(),
        cache,
        logits: Tensor::cat(&[a.logits, b.logits], 0)?,
    })
}

fn mask_tensor(valid: &[Vec<u8>], device: &candle_core::Device) -> Result<Tensor> {
    let (b, s) = (valid.len(), valid.first().map_or(0, Vec::len));
    Ok(Tensor::from_vec(valid.concat(), (b, s), device)?)
}

/// Logits `(B, V)` (f32) of the last position, on the model's device.
fn last_logits(model: &Qwen, hidden: &Tensor) -> Result<Tensor> {
    let t = hidden.dim(1)?;
    let last = hidden.narrow(1, t - 1, 1)?.squeeze(1)?;
    model.sampling_logits(&last)
}

fn hits_stop_string(tokens: &[u32], stop: &StopCriteria) -> bool {
    let Some(decode) = stop.decode else {
        return false;
    };
    if stop.stop_strings.is_empty() {
        return false;
    }
    // Only the tail can contain a new match: decode enough tokens to cover the longest string.
    let longest = stop.stop_strings.iter().map(String::len).max().unwrap_or(0);
    let tail = &tokens[tokens.len().saturating_sub(longest + 2)..];
    let text = decode(tail);
    stop.stop_strings.iter().any(|s| text.contains(s.as_str()))
}

/// Sampling settings, shared by training rollouts and evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sampling {
    /// Responses per prompt.
    pub n: usize,
    /// 0 means greedy (evaluation only).
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::GenStats;

    #[test]
    fn the_hosts_share_is_the_decode_time_it_did_not_wait() {
        let stats = |decode, wait| GenStats {
            decode_seconds: decode,
            decode_wait_seconds: wait,
            ..GenStats::default()
        };
        assert_eq!(stats(2.0, 0.5).host_share(), Some(0.75));
        assert_eq!(stats(2.0, 0.0).host_share(), Some(1.0));
        // a wait measured over a decode time taken by subtraction can round past it
        assert_eq!(stats(1.0, 1.0 + 1e-12).host_share(), Some(0.0));
        assert_eq!(stats(0.0, 0.0).host_share(), None);
    }
}
