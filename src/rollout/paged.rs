//! The sampling engine over a paged KV cache ([`crate::model::paged`]), an option of
//! [`super::generate`] ([`SampleRequest::paged`]).
//!
//! What differs from the dense engine ([`super::decode_all`]):
//! - Admission by memory: a waiting prompt joins while the pool has its prompt's blocks and
//!   one block of room for every sequence in the batch (`max_batch`, when given, still caps
//!   it): the batch is bounded by the lengths sampled, not by the longest a response may grow
//!   to. A sequence takes a block when its length crosses a block boundary, at most one a
//!   step, so admission's room covers the next step only; as the sequences grow they can
//!   outgrow the pool. Then the most recently admitted sequences are preempted (as vLLM
//!   does, by recomputation): their blocks go back to the pool and their prompts to the head
//!   of the queue, to be prefilled and decoded again from the start. A completion depends only
//!   on its prompt and its key (its random stream restarts), so a preempted sequence's tokens
//!   are the same. The oldest sequence is never preempted, so every step makes progress; a
//!   sequence that alone does not fit in the pool is an error
//!   ([`crate::model::paged::PagedError::Exhausted`]).
//! - A joining prompt writes only its own blocks: nothing of the other sequences moves.
//! - Identical prompts (the n responses of a GRPO group) are prefilled once and share the
//!   prompt's blocks; the first token of each is drawn from the same logits, each with its own
//!   key, and a response copies only the partially filled last prompt block, when it first
//!   writes into it.
//!
//! Attention reads each sequence's keys through its blocks: on CUDA the decode kernel reads
//! the block tables; on the CPU each layer gathers the keys into the dense engine's layout
//! (its width and right alignment), so that the numbers are the dense engine's bit for bit
//! (tests/it/model.rs holds the two engines to that, and the block-table path to the same
//! tokens; under an FP8 cache the same tokens, the log-probs to their last bits:
//! kernels/NOTES.md, version 13).

use std::collections::{HashMap, VecDeque};

use candle_core::Tensor;

use super::{
    add_stats, draw, last_logits, prefill, settle, Completion, GenStats, SampleKey, SampleRequest,
};
use crate::model::paged::{BlockPool, PagedKv, PagedRead, PagedStep, SeqBlocks};
use crate::model::qwen::Qwen;
use crate::model::Result;
use crate::rng::SplitMix64;

/// How the paged engine sizes and reads its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedOptions {
    /// Bytes for the pool. None: half the device's free memory on CUDA (the other half for the
    /// step's activations and logits); on the CPU, room for every prompt at its full length.
    pub budget: Option<u128>,
    /// Positions per block (a multiple of 32).
    pub block: usize,
    /// Identical prompts share one prefill and the prompt's blocks.
    pub share_prompts: bool,
    /// Attention through the block tables (the decode kernel on CUDA, its twin on the CPU)
    /// rather than a gathered view; None: the tables where the kernel runs (CUDA), else the
    /// gathered view.
    pub tables: Option<bool>,
    /// At most this many positions (rows × their left-padded width) in one prefill call: the
    /// joining prompts are prefilled in consecutive groups under it (a prompt longer than it
    /// alone), which bounds the prefill's transient memory (its dense keys and values before
    /// they are written to blocks, and its activations) while the pool holds the rest. None:
    /// [`PREFILL_TOKENS`] on CUDA; on the CPU one call for all, as the dense engine prefills
    /// (the padding is part of a result's bits there).
    pub prefill_tokens: Option<usize>,
}

/// The prefill's token budget on CUDA when [`PagedOptions::prefill_tokens`] is unset: 16,384
/// positions, about 1.9 GB of transient keys and values and 1 GB of activations at
/// Qwen3-1.7B's shapes (2.4 GB and 2 GB at Qwen3-8B's), a few percent of an H100 beside the
/// pool's half; enough for 16 of the paper's 1,024-token prompts in one call, whose prefill is
/// already compute-bound at that size.
pub const PREFILL_TOKENS: usize = 16_384;

impl Default for PagedOptions {
    fn default() -> PagedOptions {
        PagedOptions {
            budget: None,
            block: crate::model::paged::BLOCK,
            share_prompts: true,
            tables: None,
            prefill_tokens: None,
        }
    }
}

/// A sequence being decoded: prompt `prompt`, its positions in `seq`.
struct Row {
    prompt: usize,
    seq: SeqBlocks,
}

/// A prefilled prompt kept while more of its responses wait: its blocks and the logits its
/// first token is drawn from `(1, V)`.
struct Shared {
    seq: SeqBlocks,
    logits: Tensor,
}

/// The engine's state besides the completions.
struct Engine<'a> {
    model: &'a Qwen,
    prompts: &'a [Vec<u32>],
    pad_id: u32,
    opts: PagedOptions,
    tables: bool,
    /// Positions one prefill call takes at most (None: no bound).
    prefill_budget: Option<usize>,
    kv: PagedKv,
    rows: Vec<Row>,
    /// `(rows, V)` in the model's dtype ([`Qwen::sampling_logits`]): the logits the next token
    /// of each row is drawn from.
    logits: Option<Tensor>,
    /// The dense engine's column count for this batch before any of its drops (`with_room`):
    /// the gathered view's width.
    width: usize,
    /// Per distinct prompt, how many of its sequences have not been admitted.
    pending: HashMap<&'a [u32], usize>,
    shared: HashMap<&'a [u32], Shared>,
}

/// The pool for this request: `opts.budget`, or what the device gives (see [`PagedOptions`]).
fn pool(
    model: &Qwen,
    prompts: &[Vec<u32>],
    max_new: usize,
    opts: &PagedOptions,
) -> Result<PagedKv> {
    // The pool holds what the dense cache would: E4M3 bytes for an FP8 cache on a GPU.
    let (cfg, dtype, device) = (model.config(), model.kv_storage_dtype(), model.device());
    let budget = match opts.budget {
        Some(b) => b,
        None if device.is_cuda() => {
            let free = crate::device::PeakMeter::new(device).free().unwrap_or(0);
            u128::from(free / 2)
        }
        None => {
            // Each prompt at full length and the block of room admission keeps for it.
            let per = PagedKv::block_bytes(cfg, dtype.size_in_bytes(), opts.block) as u128;
            let blocks: usize = prompts
                .iter()
                .map(|p| (p.len() + max_new).div_ceil(opts.block.max(1)) + 1)
                .sum();
            (blocks as u128 + 1) * per
        }
    };
    PagedKv::for_budget(cfg, dtype, device, budget, opts.block)
}

/// [`super::generate`] over a paged cache (see the module).
pub fn decode_all_paged(
    model: &Qwen,
    prompts: &[Vec<u32>],
    keys: &[SampleKey],
    request: &SampleRequest,
    opts: PagedOptions,
) -> Result<Vec<Completion>> {
    let params = &request.params;
    let mut out: Vec<Completion> = prompts.iter().map(|_| Completion::empty()).collect();
    if prompts.is_empty() || params.max_new_tokens == 0 {
        return Ok(out);
    }
    let mut rngs: Vec<SplitMix64> = keys.iter().map(|k| SplitMix64::from_key(k)).collect();
    let slots = request.max_batch.unwrap_or(prompts.len()).max(1);
    let mut waiting: VecDeque<usize> = (0..prompts.len()).collect();
    let mut engine = Engine::new(model, prompts, request, opts)?;
    let mut next_pos: Vec<u32> = prompts.iter().map(|p| p.len() as u32).collect();
    // what was queued before the decoding (the pool's zero fill, the caller's work) is not its
    settle(model, request)?;
    let started = std::time::Instant::now();
    let mut timed = GenStats::default();

    loop {
        let active: Vec<usize> = engine.rows.iter().map(|r| r.prompt).collect();
        let (keep, mut next_ids) = match &engine.logits {
            Some(logits) => draw(logits, &active, &mut rngs, &mut out, request, &mut timed)?,
            None => (Vec::new(), Vec::new()),
        };
        // The finished rows give their blocks back.
        let (mut kept, finished) = engine.split_rows(&keep);
        for row in finished {
            engine.kv.pool.release(row.seq);
        }
        // Admission's room covers one step, not the rows' growth: when the pool cannot give
        // every row its next position, the most recently admitted rows are preempted.
        for i in engine.make_room(&mut kept)? {
            next_ids.pop();
            waiting.push_front(i);
            out[i] = Completion::empty();
            rngs[i] = SplitMix64::from_key(&keys[i]);
            next_pos[i] = prompts[i].len() as u32;
        }
        // Admission holds back a block for each row besides what its next position takes, so
        // that the next step's positions find room (a row needs at most one block a step).
        let room = slots.saturating_sub(kept.len());
        let reserved = engine.append_needs(&kept);
        let joining = engine.admissible(&mut waiting, room, reserved + kept.len());
        if kept.is_empty() && joining.is_empty() {
            if let Some(&i) = waiting.front() {
                let need = engine.kv.pool.blocks_for(prompts[i].len()) + 1;
                let pool = &engine.kv.pool;
                return Err(pool
                    .exhausted(need.saturating_sub(pool.free_blocks()).max(1))
                    .into());
            }
            break;
        }
        engine.rows = kept;
        if engine.rows.is_empty() {
            engine.logits = None;
        } else {
            engine.decode(next_ids, &mut next_pos, &mut timed)?;
        }
        if !joining.is_empty() {
            engine.join(joining, request, &mut timed)?;
        }
    }
    for (_, s) in engine.shared.drain() {
        engine.kv.pool.release(s.seq);
    }
    debug_assert_eq!(engine.kv.pool.free_blocks(), engine.kv.pool.capacity());
    if let Some(stats) = request.stats {
        let decode_seconds = started.elapsed().as_secs_f64() - timed.prefill_seconds;
        add_stats(stats, &timed, decode_seconds, &out);
    }
    Ok(out)
}

impl<'a> Engine<'a> {
    /// The engine for `request` on `prompts`: its pool ([`pool`]), no row admitted yet, every
    /// prompt pending; block tables where the decode kernel takes them (`opts.tables`, by default
    /// on a GPU), a prefill budget ([`PREFILL_TOKENS`] by default on a GPU).
    fn new(
        model: &'a Qwen,
        prompts: &'a [Vec<u32>],
        request: &SampleRequest,
        opts: PagedOptions,
    ) -> Result<Engine<'a>> {
        let mut pending: HashMap<&[u32], usize> = HashMap::new();
        for p in prompts {
            *pending.entry(p.as_slice()).or_default() += 1;
        }
        let (device, cfg) = (model.device(), model.config());
        let groups = cfg.num_attention_heads / cfg.num_key_value_heads.max(1);
        let tables = opts.tables.unwrap_or(device.is_cuda())
            && crate::fused::paged_applies(device, model.dtype(), cfg.head_dim(), groups);
        let prefill_budget = opts
            .prefill_tokens
            .or_else(|| device.is_cuda().then_some(PREFILL_TOKENS));
        Ok(Engine {
            model,
            prompts,
            pad_id: request.pad_id,
            opts,
            tables,
            prefill_budget,
            kv: pool(model, prompts, request.params.max_new_tokens, &opts)?,
            rows: Vec::new(),
            logits: None,
            width: 0,
            pending,
            shared: HashMap::new(),
        })
    }

    /// Blocks the rows need for their next position.
    fn append_needs(&self, rows: &[Row]) -> usize {
        rows.iter().map(|r| self.kv.pool.append_needs(&r.seq)).sum()
    }

    /// Makes room in the pool for the next position of every row of `kept`: preempts the most
    /// recently admitted rows (popped from `kept`; their prompts returned, latest first, to be
    /// queued again) and, for a lone row, drops the prefilled prompts held for responses still
    /// waiting. A lone row that still does not fit is
    /// [`crate::model::paged::PagedError::Exhausted`].
    fn make_room(&mut self, kept: &mut Vec<Row>) -> Result<Vec<usize>> {
        let mut preempted = Vec::new();
        loop {
            let (needs, free) = (self.append_needs(kept), self.kv.pool.free_blocks());
            if needs <= free {
                return Ok(preempted);
            }
            if kept.len() > 1 {
                let row = kept.pop().expect("invariant: more than one row");
                preempted.push(row.prompt);
                self.preempt(row);
            } else if !self.shared.is_empty() {
                // The prompts held for responses still waiting are prefilled again when
                // those join.
                for (_, s) in self.shared.drain() {
                    self.kv.pool.release(s.seq);
                }
            } else {
                return Err(self.kv.pool.exhausted(needs - free).into());
            }
        }
    }

    /// Gives a row's blocks back and counts its prompt as waiting again.
    fn preempt(&mut self, row: Row) {
        self.kv.pool.release(row.seq);
        *self
            .pending
            .entry(self.prompts[row.prompt].as_slice())
            .or_default() += 1;
    }

    /// The rows at `keep` (in that order), and the others.
    fn split_rows(&mut self, keep: &[usize]) -> (Vec<Row>, Vec<Row>) {
        let mut all: Vec<Option<Row>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        let kept = keep
            .iter()
            .map(|&r| all[r].take().expect("invariant: each row kept once"))
            .collect();
        (kept, all.into_iter().flatten().collect())
    }

    /// Up to `room` prompts from the head of `waiting` that the pool takes ([`admit`]).
    fn admissible(
        &self,
        waiting: &mut VecDeque<usize>,
        room: usize,
        reserved: usize,
    ) -> Vec<usize> {
        let held = |p: &[u32]| self.shared.contains_key(p);
        admit(
            &self.kv.pool,
            self.prompts,
            &held,
            self.opts.share_prompts,
            waiting,
            room,
            reserved,
        )
    }

    /// Prefills the distinct new prompts among `joining` (in left-padded groups under the
    /// prefill budget: [`Engine::prefill_fresh`]), writes their keys and values to fresh blocks,
    /// and appends every joining prompt as a row (sharing the blocks of an identical prompt's
    /// prefill), right-aligned to the dense engine's width.
    fn join(
        &mut self,
        joining: Vec<usize>,
        request: &SampleRequest,
        timed: &mut GenStats,
    ) -> Result<()> {
        let prompts = self.prompts;
        let share = self.opts.share_prompts;
        let held = |p: &[u32]| self.shared.contains_key(p);
        let fresh = fresh_prompts(prompts, &joining, &held, share);
        let prefilled = self.prefill_fresh(&fresh, request, timed)?;
        // Each joining prompt's row: its own prefill's blocks, or a fork of a shared one.
        let mut logits = Vec::with_capacity(joining.len());
        let mut first_use: Vec<Option<(SeqBlocks, Tensor)>> = Vec::new();
        let mut index_of: HashMap<usize, usize> = HashMap::new();
        for (i, seq, l) in prefilled {
            index_of.insert(i, first_use.len());
            first_use.push(Some((seq, l)));
        }
        for &i in &joining {
            let p = prompts[i].as_slice();
            let left = self
                .pending
                .get_mut(p)
                .expect("invariant: every prompt counted");
            *left -= 1;
            let (seq, l) = if let Some(slot) = index_of.get(&i) {
                let (seq, l) = first_use[*slot].take().expect("invariant: used once");
                if share && *left > 0 {
                    let kept = self.kv.pool.fork(&seq);
                    self.shared.insert(
                        p,
                        Shared {
                            seq: kept,
                            logits: l.clone(),
                        },
                    );
                }
                (seq, l)
            } else {
                let s = self
                    .shared
                    .get(p)
                    .expect("invariant: a shared prompt is held");
                let seq = self.kv.pool.fork(&s.seq);
                (seq, s.logits.clone())
            };
            if *left == 0 {
                if let Some(s) = self.shared.remove(p) {
                    self.kv.pool.release(s.seq);
                }
            }
            logits.push(l);
            self.rows.push(Row { prompt: i, seq });
        }
        let joined_width = joining.iter().map(|&i| prompts[i].len()).max().unwrap_or(0);
        let had = self.logits.take();
        self.width = if had.is_some() {
            self.width.max(joined_width)
        } else {
            joined_width
        };
        let mut all: Vec<Tensor> = had.into_iter().collect();
        all.extend(logits);
        self.logits = Some(Tensor::cat(&all, 0)?);
        Ok(())
    }

    /// Prefills `fresh` (distinct prompts, in order) in groups under the prefill budget, each
    /// group's keys and values written to fresh blocks: per prompt its blocks and the logits its
    /// first token is drawn from, in `fresh`'s order.
    fn prefill_fresh(
        &mut self,
        fresh: &[usize],
        request: &SampleRequest,
        timed: &mut GenStats,
    ) -> Result<Vec<(usize, SeqBlocks, Tensor)>> {
        let prompts = self.prompts;
        let mut prefilled = Vec::with_capacity(fresh.len());
        for group in prefill_groups(prompts, fresh, self.prefill_budget) {
            // the decode step queued before a joining prefill: waited for as decode time
            timed.decode_wait_seconds += settle(self.model, request)?;
            let t = std::time::Instant::now();
            timed.prefill_tokens += group.iter().map(|&i| prompts[i].len()).sum::<usize>();
            let batch = prefill(self.model, prompts, group.clone(), self.pad_id, 0)?;
            let longest = batch.valid.first().map_or(0, Vec::len);
            timed.widest_prefill = timed.widest_prefill.max(group.len() * longest);
            let mut dest = Vec::with_capacity(group.len() * longest);
            let mut seqs = Vec::with_capacity(group.len());
            for &i in &group {
                let seq = self.kv.pool.allocate(prompts[i].len())?;
                let pad = longest - prompts[i].len();
                dest.extend((0..longest).map(|c| {
                    if c < pad {
                        (0, 0)
                    } else {
                        seq.slot(c - pad, self.kv.block())
                    }
                }));
                seqs.push(seq);
            }
            self.kv.store(batch.cache.layers(), &dest)?;
            for (r, (i, seq)) in group.iter().zip(seqs).enumerate() {
                prefilled.push((*i, seq, batch.logits.narrow(0, r, 1)?));
            }
            // The group's dense keys and values go before the next group's prefill.
            drop(batch);
            settle(self.model, request)?;
            timed.prefill_seconds += t.elapsed().as_secs_f64();
        }
        Ok(prefilled)
    }

    /// One decode step of every row (each row's next token `next_ids[r]`): room for the new
    /// position (a block copied first where one is shared), its keys and values written there,
    /// attention through the blocks; counted in `timed` (the rows, the step, the positions each
    /// row attends over).
    fn decode(
        &mut self,
        next_ids: Vec<u32>,
        next_pos: &mut [u32],
        timed: &mut GenStats,
    ) -> Result<()> {
        let device = self.model.device().clone();
        let (kvh, block) = (self.kv.kv_heads(), self.kv.block());
        let n = self.rows.len();
        let mut copies = Vec::new();
        let mut write = Vec::with_capacity(n * kvh);
        for row in &mut self.rows {
            let ap = self.kv.pool.append(&mut row.seq)?;
            copies.extend(ap.copy);
            write.extend((0..kvh).map(|g| self.kv.row(ap.block, g, ap.row)));
        }
        self.kv.copy_blocks(&copies)?;
        self.width += 1;
        let read = if self.tables {
            let nblk = self
                .rows
                .iter()
                .map(|r| r.seq.table().len())
                .max()
                .unwrap_or(0);
            let mut tables = vec![0u32; n * nblk];
            for (r, row) in self.rows.iter().enumerate() {
                tables[r * nblk..r * nblk + row.seq.table().len()].copy_from_slice(row.seq.table());
            }
            let lens: Vec<u32> = self.rows.iter().map(|r| r.seq.len() as u32).collect();
            PagedRead::Table {
                tables: Tensor::from_vec(tables, (n, nblk), &device)?,
                lens: crate::fused::RowLens::new(lens, &device)?,
                block,
            }
        } else {
            let w = self.width;
            let mut index = Vec::with_capacity(n * kvh * w);
            let mut valid = Vec::with_capacity(n * w);
            for row in &self.rows {
                let pad = w - row.seq.len();
                for g in 0..kvh {
                    index.extend((0..w).map(|c| {
                        if c < pad {
                            self.kv.scratch_row()
                        } else {
                            let (b, r) = row.seq.slot(c - pad, block);
                            self.kv.row(b, g, r)
                        }
                    }));
                }
                valid.extend((0..w).map(|c| u8::from(c >= pad)));
            }
            PagedRead::Gather {
                index: Tensor::from_vec(index, n * kvh * w, &device)?,
                width: w,
                key_valid: Tensor::from_vec(valid, (n, w), &device)?,
            }
        };
        let step = PagedStep {
            write: self.kv.write_index(&write, &device)?,
            read,
        };
        let ids = Tensor::from_vec(next_ids, (n, 1), &device)?;
        let pos: Vec<u32> = self.rows.iter().map(|r| next_pos[r.prompt]).collect();
        for r in &self.rows {
            next_pos[r.prompt] += 1;
        }
        timed.most_rows = timed.most_rows.max(n);
        timed.decode_steps += 1;
        timed.decode_positions += pos.iter().map(|&p| p as usize + 1).sum::<usize>();
        let pos = Tensor::from_vec(pos, (n, 1), &device)?;
        let hidden = self.model.forward_paged(&ids, &pos, &self.kv, &step)?;
        self.logits = Some(last_logits(self.model, &hidden)?);
        Ok(())
    }
}

/// Up to `room` prompts from the head of `waiting` that `pool` takes, `reserved` blocks held
/// back: each needs its prompt's blocks (none, with `share`, when it shares a prompt `held`
/// prefilled or one joining with it) and one more for its first positions. The first prompt
/// of an empty batch (nothing reserved) is taken whenever its blocks fit at all. The engine's
/// admission, and its schedule's ([`paged_schedule`]).
fn admit(
    pool: &BlockPool,
    prompts: &[Vec<u32>],
    held: &dyn Fn(&[u32]) -> bool,
    share: bool,
    waiting: &mut VecDeque<usize>,
    room: usize,
    reserved: usize,
) -> Vec<usize> {
    let mut free = pool.free_blocks().saturating_sub(reserved);
    let mut taken: Vec<usize> = Vec::new();
    while taken.len() < room {
        let Some(&i) = waiting.front() else { break };
        let p = prompts[i].as_slice();
        let shares = share && (held(p) || taken.iter().any(|&j| prompts[j].as_slice() == p));
        let prompt_blocks = if shares { 0 } else { pool.blocks_for(p.len()) };
        let lone = taken.is_empty() && reserved == 0;
        let need = prompt_blocks + usize::from(!lone);
        if need > free || (lone && prompt_blocks > free) {
            break;
        }
        free -= need.min(free);
        taken.push(i);
        waiting.pop_front();
    }
    taken
}

/// The prompts of `joining` to prefill: with `share`, each distinct one not `held` already (the
/// others fork its blocks); without, every one. The engine's join, and its schedule's.
fn fresh_prompts(
    prompts: &[Vec<u32>],
    joining: &[usize],
    held: &dyn Fn(&[u32]) -> bool,
    share: bool,
) -> Vec<usize> {
    let mut fresh: Vec<usize> = Vec::new();
    for &i in joining {
        let p = prompts[i].as_slice();
        let shares = share && (held(p) || fresh.iter().any(|&j| prompts[j].as_slice() == p));
        if !shares {
            fresh.push(i);
        }
    }
    fresh
}

/// What a paged run does, counted ([`paged_schedule`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PagedSchedule {
    /// The decode steps, the key positions they attended over, the most rows a step took, the
    /// prompt tokens prefilled and the widest prefill: as [`GenStats`] counts them.
    pub decode_steps: usize,
    pub decode_positions: usize,
    pub most_rows: usize,
    pub prefill_tokens: usize,
    pub widest_prefill: usize,
    /// Rows preempted (their blocks given back, their prompts queued again and recomputed).
    pub preempted: usize,
    /// Times the prompts held for responses still waiting were dropped to make room for a lone
    /// row (prefilled again when those join).
    pub held_dropped: usize,
}

/// What the paged engine (`decode_all_paged`: [`super::generate`] over [`PagedOptions`]) does
/// when every prompt samples exactly its limit in `limits` (no stop token), without a model:
/// the engine's loop over a [`BlockPool`] of `blocks` blocks (block 0 included, as
/// `PagedKv::for_budget` counts them) of `opts.block` positions, at most `max_batch` rows; the
/// same admission (`admit`), growth, preemption of the latest rows, shared prompts, and
/// prefills in groups under `opts.prefill_tokens` (None: one group). Its counts are the
/// engine's on the same prompts (`tests/it/model.rs` holds them to a run's), so a GPU run's
/// decode steps and the positions they read can be known on the CPU at that GPU's pool
/// (`acpo bench decode-predict`). Each limit is the engine's for its row: the caller clamps it
/// to the request's `max_new_tokens` (one at least is taken here, as the engine takes it). A
/// pool that cannot hold a row is [`crate::model::paged::PagedError::Exhausted`], where the
/// engine's would be.
pub fn paged_schedule(
    prompts: &[Vec<u32>],
    limits: &[usize],
    max_batch: Option<usize>,
    blocks: usize,
    opts: &PagedOptions,
) -> Result<PagedSchedule> {
    let mut s = PagedSchedule::default();
    let n = prompts.len();
    let mut pool = BlockPool::new(blocks, opts.block)?;
    let slots = max_batch.unwrap_or(n).max(1);
    let mut waiting: VecDeque<usize> = (0..n).collect();
    let mut pending: HashMap<&[u32], usize> = HashMap::new();
    for p in prompts {
        *pending.entry(p.as_slice()).or_default() += 1;
    }
    let mut shared: HashMap<&[u32], SeqBlocks> = HashMap::new();
    // Each row: its prompt and blocks; what it has drawn; the position it feeds next.
    let mut rows: Vec<(usize, SeqBlocks)> = Vec::new();
    let mut drawn = vec![0usize; n];
    let mut next_pos: Vec<usize> = prompts.iter().map(Vec::len).collect();
    loop {
        // Every row draws a token; the finished ones give their blocks back.
        let mut kept = Vec::with_capacity(rows.len());
        for (i, seq) in rows.drain(..) {
            drawn[i] += 1;
            if drawn[i] < limits[i].max(1) {
                kept.push((i, seq));
            } else {
                pool.release(seq);
            }
        }
        // Room for every row's next position: the latest rows preempted, then the held prompts.
        loop {
            let needs: usize = kept.iter().map(|(_, q)| pool.append_needs(q)).sum();
            if needs <= pool.free_blocks() {
                break;
            }
            if kept.len() > 1 {
                let (i, seq) = kept.pop().expect("invariant: more than one row");
                pool.release(seq);
                *pending.entry(prompts[i].as_slice()).or_default() += 1;
                waiting.push_front(i);
                (drawn[i], next_pos[i]) = (0, prompts[i].len());
                s.preempted += 1;
            } else if !shared.is_empty() {
                for (_, seq) in shared.drain() {
                    pool.release(seq);
                }
                s.held_dropped += 1;
            } else {
                return Err(pool.exhausted(needs - pool.free_blocks()).into());
            }
        }
        let room = slots.saturating_sub(kept.len());
        let reserved = kept
            .iter()
            .map(|(_, q)| pool.append_needs(q))
            .sum::<usize>()
            + kept.len();
        let held = |p: &[u32]| shared.contains_key(p);
        let joining = admit(
            &pool,
            prompts,
            &held,
            opts.share_prompts,
            &mut waiting,
            room,
            reserved,
        );
        if kept.is_empty() && joining.is_empty() {
            if let Some(&i) = waiting.front() {
                let need = pool.blocks_for(prompts[i].len()) + 1;
                return Err(pool
                    .exhausted(need.saturating_sub(pool.free_blocks()).max(1))
                    .into());
            }
            break;
        }
        rows = kept;
        if !rows.is_empty() {
            for (i, seq) in &mut rows {
                pool.append(seq)?;
                s.decode_positions += next_pos[*i] + 1;
                next_pos[*i] += 1;
            }
            s.most_rows = s.most_rows.max(rows.len());
            s.decode_steps += 1;
        }
        // The joining prompts: each distinct one not held prefilled into fresh blocks, the
        // others forks of a held or fresh one.
        let held = |p: &[u32]| shared.contains_key(p);
        let fresh = fresh_prompts(prompts, &joining, &held, opts.share_prompts);
        let mut first_use: HashMap<usize, SeqBlocks> = HashMap::new();
        for group in prefill_groups(prompts, &fresh, opts.prefill_tokens) {
            let longest = group.iter().map(|&i| prompts[i].len()).max().unwrap_or(0);
            s.prefill_tokens += group.iter().map(|&i| prompts[i].len()).sum::<usize>();
            s.widest_prefill = s.widest_prefill.max(group.len() * longest);
            for &i in &group {
                first_use.insert(i, pool.allocate(prompts[i].len())?);
            }
        }
        for &i in &joining {
            let p = prompts[i].as_slice();
            let left = pending.get_mut(p).expect("invariant: every prompt counted");
            *left -= 1;
            let seq = match first_use.remove(&i) {
                Some(seq) => {
                    if opts.share_prompts && *left > 0 {
                        shared.insert(p, pool.fork(&seq));
                    }
                    seq
                }
                None => pool.fork(shared.get(p).expect("invariant: a shared prompt is held")),
            };
            if *left == 0 {
                if let Some(held) = shared.remove(p) {
                    pool.release(held);
                }
            }
            rows.push((i, seq));
        }
    }
    for (_, seq) in shared.drain() {
        pool.release(seq);
    }
    Ok(s)
}

/// `fresh` (prompt indices, in order) cut into consecutive groups of at most `budget` positions
/// each once left-padded to the group's longest prompt; a prompt longer than the budget is a
/// group alone. None: one group.
fn prefill_groups(prompts: &[Vec<u32>], fresh: &[usize], budget: Option<usize>) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut longest = 0;
    for &i in fresh {
        let len = prompts[i].len();
        let fits = |g: &Vec<usize>| budget.is_none_or(|b| (g.len() + 1) * longest.max(len) <= b);
        match groups.last_mut() {
            Some(g) if fits(g) => {
                g.push(i);
                longest = longest.max(len);
            }
            _ => {
                groups.push(vec![i]);
                longest = len;
            }
        }
    }
    groups
}
