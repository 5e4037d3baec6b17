//! A paged KV cache: every layer's keys and values in one pool of fixed-size blocks, and each
//! sequence a table of the blocks its positions fill.
//!
//! - The pool is sized once, from a byte budget ([`PagedKv::for_budget`]); a sequence takes a
//!   block when its length crosses a block boundary, so the sequences a pool holds are bounded
//!   by their real lengths, not by the longest a response may grow to.
//! - A prompt joining a batch writes its own blocks; nothing of the other sequences is copied.
//! - Blocks are reference counted: [`BlockPool::fork`] gives a sequence the blocks of another
//!   (the n responses of a group share their prompt's), and a sequence that appends into a
//!   block it shares first copies that block (copy on write: only a partially filled last
//!   prompt block is ever copied, full blocks are never written again).
//! - Running out is an error ([`PagedError::Exhausted`]), never a panic; the sampler
//!   ([`crate::rollout`]) admits prompts while blocks are free and gives a sequence's blocks
//!   back to the pool when it finishes.
//!
//! Layout: a layer's K (and V) is one `(blocks · KV · BLOCK, D)` tensor, block b's head g
//! holding rows `(b · KV + g) · BLOCK ..`: each (block, head) is `BLOCK · D` contiguous numbers,
//! which the CUDA decode kernel reads through the block table (kernels/flash_decode.cu). Block 0
//! is never handed out: the rows a batched prefill computes for left padding are written there,
//! and the CPU's gathered view reads its padding columns from there (masked: each weighs ~1e-38
//! there, the CPU exp's floor, which under an FP8 cache can move a last bit against the dense
//! cache's own padding; kernels/NOTES.md, version 13).

use candle_core::{DType, Device, Tensor};

use super::QwenConfig;

/// Positions per block: a multiple of the decode kernel's 32-key tile, so that a tile never
/// straddles two blocks.
pub const BLOCK: usize = 32;

/// The block that is never allocated (padding is written to and read from it).
const SCRATCH: u32 = 0;

/// Rows a prefill's store writes at once ([`PagedKv::store`]): 32 MB of scatter index at a head
/// dim of 128.
const STORE_ROWS: usize = 1 << 16;

/// Why the paged cache could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PagedError {
    #[error(
        "the KV cache pool is exhausted: {needed} more blocks of {block} positions needed, \
         {free} of {total} free"
    )]
    Exhausted {
        needed: usize,
        free: usize,
        total: usize,
        block: usize,
    },
    #[error(
        "a KV cache pool of {bytes} bytes holds {blocks} blocks of {block_bytes} bytes; \
         at least 2 are needed"
    )]
    TooSmall {
        bytes: u128,
        blocks: usize,
        block_bytes: usize,
    },
    #[error("the KV cache's block size must be a positive multiple of 32, not {0}")]
    BlockSize(usize),
}

/// The block allocator: reference counts and a free list (no tensors).
#[derive(Debug, Clone)]
pub struct BlockPool {
    block: usize,
    refs: Vec<u32>,
    free: Vec<u32>,
}

/// One sequence's blocks: `table[i]` holds its positions `i · block ..`, `len` of them filled.
/// Owns one reference to each of its blocks; give it back with [`BlockPool::release`].
#[derive(Debug, PartialEq, Eq)]
pub struct SeqBlocks {
    table: Vec<u32>,
    len: usize,
}

impl SeqBlocks {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// The block and the row within it of position `p` (< len).
    pub fn slot(&self, p: usize, block: usize) -> (u32, usize) {
        (self.table[p / block], p % block)
    }
}

/// Where a new position goes, and the block copy (from, to) that must happen first when the
/// sequence shared its partially filled last block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Append {
    pub block: u32,
    pub row: usize,
    pub copy: Option<(u32, u32)>,
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block` positions, block 0 kept back (see the module).
    pub fn new(blocks: usize, block: usize) -> Result<BlockPool, PagedError> {
        if block == 0 || !block.is_multiple_of(32) {
            return Err(PagedError::BlockSize(block));
        }
        let mut refs = vec![0u32; blocks.max(1)];
        refs[SCRATCH as usize] = 1;
        // Handed out lowest first (a stack popped from its end).
        let free = (1..blocks as u32).rev().collect();
        Ok(BlockPool { block, refs, free })
    }

    /// Positions per block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// Blocks that can be handed out (all but the scratch block).
    pub fn capacity(&self) -> usize {
        self.refs.len() - 1
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks that `len` positions fill.
    pub fn blocks_for(&self, len: usize) -> usize {
        len.div_ceil(self.block)
    }

    /// Holders of block `b` (0: free).
    pub fn refs(&self, b: u32) -> u32 {
        self.refs[b as usize]
    }

    /// The error of a pool `needed` blocks short of what was asked.
    pub fn exhausted(&self, needed: usize) -> PagedError {
        PagedError::Exhausted {
            needed,
            free: self.free.len(),
            total: self.capacity(),
            block: self.block,
        }
    }

    fn take(&mut self) -> Result<u32, PagedError> {
        let b = self.free.pop().ok_or_else(|| self.exhausted(1))?;
        self.refs[b as usize] = 1;
        Ok(b)
    }

    fn drop_ref(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        debug_assert!(*r > 0 && b != SCRATCH, "block {b} released while free");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }

    /// A new sequence of `len` positions (a prefilled prompt): all its blocks, or none and an
    /// error.
    pub fn allocate(&mut self, len: usize) -> Result<SeqBlocks, PagedError> {
        let n = self.blocks_for(len);
        if n > self.free.len() {
            return Err(self.exhausted(n - self.free.len()));
        }
        let table = (0..n).map(|_| self.take()).collect::<Result<_, _>>()?;
        Ok(SeqBlocks { table, len })
    }

    /// Another sequence holding the same positions in the same blocks.
    pub fn fork(&mut self, seq: &SeqBlocks) -> SeqBlocks {
        for &b in &seq.table {
            self.refs[b as usize] += 1;
        }
        SeqBlocks {
            table: seq.table.clone(),
            len: seq.len,
        }
    }

    /// Blocks that appending one position to `seq` takes from the free list: one when it
    /// starts a block or writes into a block it shares, else none.
    pub fn append_needs(&self, seq: &SeqBlocks) -> usize {
        if seq.len.is_multiple_of(self.block) {
            return 1;
        }
        let last = *seq.table.last().expect("invariant: a partial block exists");
        usize::from(self.refs[last as usize] > 1)
    }

    /// Room for position `seq.len` (which becomes filled): a new block when it starts one; a
    /// private copy of the last block when that block is shared (the caller copies its rows,
    /// [`Append::copy`]).
    pub fn append(&mut self, seq: &mut SeqBlocks) -> Result<Append, PagedError> {
        let row = seq.len % self.block;
        let mut copy = None;
        if row == 0 {
            seq.table.push(self.take()?);
        } else {
            let last = seq.table.len() - 1;
            let old = seq.table[last];
            if self.refs[old as usize] > 1 {
                let new = self.take()?;
                self.drop_ref(old);
                seq.table[last] = new;
                copy = Some((old, new));
            }
        }
        seq.len += 1;
        Ok(Append {
            block: *seq.table.last().expect("invariant: just pushed or present"),
            row,
            copy,
        })
    }

    /// Gives the sequence's references back.
    pub fn release(&mut self, seq: SeqBlocks) {
        for b in seq.table {
            self.drop_ref(b);
        }
    }
}

/// What one forward over a paged cache writes and reads, the same in every layer.
#[derive(Debug, Clone)]
pub struct PagedStep {
    /// Where the new positions' keys and values go: the pool row of each `(row, head,
    /// position)` of the batch's `(B, KV, T, D)` keys ([`PagedKv::write_index`]).
    pub write: Tensor,
    pub read: PagedRead,
}

/// How attention reads a batch's keys from the pool.
#[derive(Debug, Clone)]
pub enum PagedRead {
    /// Each row's keys gathered into a `(B, KV, width, D)` view (`index`: the pool row of each
    /// of its `B · KV · width` rows), right-aligned, and attended with the dense cache's mask
    /// `key_valid` `(B, width)`. The CPU's path: with the dense engine's width the view holds
    /// what the dense cache's buffers hold in every column a row sees, so the numbers are the
    /// dense cache's bit for bit, while the dense engine has dropped no columns (its drops,
    /// `rollout::with_room`, narrow its buffers and, past gemm's size thresholds, the CPU's
    /// product path with them).
    Gather {
        index: Tensor,
        width: usize,
        key_valid: Tensor,
    },
    /// The decode kernel reads through the block tables (`tables` `(B, blocks)` u32, padded
    /// with 0; `lens` the keys of each row, the new one included), one query position a row.
    Table {
        tables: Tensor,
        lens: crate::fused::RowLens,
        block: usize,
    },
}

/// The pool's tensors and its allocator: per layer a K and a V tensor `(blocks · KV · BLOCK, D)`
/// on the model's device, in the dtype its cache holds (the model's, or `U8` for E4M3 bytes:
/// [`crate::model::qwen::Qwen::kv_storage_dtype`]), in the module's layout.
#[derive(Debug)]
pub struct PagedKv {
    pub pool: BlockPool,
    layers: Vec<(Tensor, Tensor)>,
    kv_heads: usize,
    head_dim: usize,
}

impl PagedKv {
    /// Bytes one block takes over all layers, keys and values.
    pub fn block_bytes(cfg: &QwenConfig, elem: usize, block: usize) -> usize {
        cfg.kv_bytes_per_position(elem) * block
    }

    /// A pool of as many blocks as `bytes` hold (block 0 included).
    pub fn for_budget(
        cfg: &QwenConfig,
        dtype: DType,
        device: &Device,
        bytes: u128,
        block: usize,
    ) -> crate::model::Result<PagedKv> {
        if block == 0 || !block.is_multiple_of(32) {
            return Err(PagedError::BlockSize(block).into());
        }
        let block_bytes = Self::block_bytes(cfg, dtype.size_in_bytes(), block).max(1);
        let blocks = usize::try_from(bytes / block_bytes as u128).unwrap_or(usize::MAX);
        if blocks < 2 {
            return Err(PagedError::TooSmall {
                bytes,
                blocks,
                block_bytes,
            }
            .into());
        }
        Self::new(cfg, dtype, device, blocks, block)
    }

    /// A pool of `blocks` blocks (block 0 included), zeroed.
    pub fn new(
        cfg: &QwenConfig,
        dtype: DType,
        device: &Device,
        blocks: usize,
        block: usize,
    ) -> crate::model::Result<PagedKv> {
        let pool = BlockPool::new(blocks, block)?;
        let (kv_heads, head_dim) = (cfg.num_key_value_heads, cfg.head_dim());
        let rows = blocks * kv_heads * block;
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| {
                Ok((
                    Tensor::zeros((rows, head_dim), dtype, device)?,
                    Tensor::zeros((rows, head_dim), dtype, device)?,
                ))
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(PagedKv {
            pool,
            layers,
            kv_heads,
            head_dim,
        })
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn block(&self) -> usize {
        self.pool.block
    }

    /// Layer i's K and V tensors (the module's layout).
    pub fn layer(&self, i: usize) -> Option<&(Tensor, Tensor)> {
        self.layers.get(i)
    }

    /// The pool row of head g of position `row` of block `b`.
    pub fn row(&self, b: u32, g: usize, row: usize) -> u32 {
        ((b as usize * self.kv_heads + g) * self.pool.block + row) as u32
    }

    /// The row a padding position is written to and read from.
    pub fn scratch_row(&self) -> u32 {
        SCRATCH
    }

    /// The scatter index of a write: `dest[i]` is the pool row of source row i, repeated over
    /// the head dim (`Tensor::scatter_set`'s index shape).
    pub fn write_index(&self, dest: &[u32], device: &Device) -> crate::model::Result<Tensor> {
        let n = dest.len();
        Ok(Tensor::from_slice(dest, (n, 1), device)?
            .broadcast_as((n, self.head_dim))?
            .contiguous()?)
    }

    /// Writes source rows `src` `(n, D)` to the pool rows of `index` ([`PagedKv::write_index`])
    /// in layer i's K (`which` 0) or V (1): a pool of E4M3 bytes (`U8`, an FP8 cache) takes
    /// bytes as they are and rounds numbers to their bytes; any other pool takes numbers.
    pub fn write(
        &self,
        i: usize,
        which: usize,
        src: &Tensor,
        index: &Tensor,
    ) -> crate::model::Result<()> {
        let (k, v) = &self.layers[i];
        let dst = if which == 0 { k } else { v };
        let src = match (dst.dtype(), src.dtype()) {
            (DType::U8, DType::U8) => src.clone(),
            (DType::U8, _) => crate::fused::to_fp8_bytes(src)?,
            (_, DType::U8) => {
                return Err(candle_core::Error::Msg(format!(
                    "paged KV write: E4M3 bytes into a pool of {:?} numbers",
                    dst.dtype()
                ))
                .into())
            }
            (to, _) => src.to_dtype(to)?,
        };
        crate::fused::store_rows(dst, index, &src)?;
        Ok(())
    }

    /// Copies blocks `from` to blocks `to` in every layer (a shared block made private before
    /// a write).
    pub fn copy_blocks(&self, copies: &[(u32, u32)]) -> crate::model::Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let per = self.kv_heads * self.pool.block;
        let (mut from, mut to) = (Vec::new(), Vec::new());
        for &(a, b) in copies {
            from.extend((0..per as u32).map(|r| a * per as u32 + r));
            to.extend((0..per as u32).map(|r| b * per as u32 + r));
        }
        let Some((k0, _)) = self.layers.first() else {
            return Ok(());
        };
        let device = k0.device();
        let from = Tensor::from_vec(from, per * copies.len(), device)?;
        let to = self.write_index(&to, device)?;
        for (k, v) in &self.layers {
            let (kr, vr) = (k.index_select(&from, 0)?, v.index_select(&from, 0)?);
            crate::fused::store_rows(k, &to, &kr)?;
            crate::fused::store_rows(v, &to, &vr)?;
        }
        Ok(())
    }

    /// Writes a dense cache's layers (`KvCache` buffers `(B, KV, T, D)` of a prefill) into the
    /// pool: row b's column t to `dest[b · T + t]`'s block and row (the scratch block for
    /// padding), every head.
    pub fn store(
        &self,
        layers: &[(Tensor, Tensor)],
        dest: &[(u32, usize)],
    ) -> crate::model::Result<()> {
        self.store_by(layers, dest, STORE_ROWS)
    }

    /// [`PagedKv::store`], `chunk` rows at a time.
    fn store_by(
        &self,
        layers: &[(Tensor, Tensor)],
        dest: &[(u32, usize)],
        chunk: usize,
    ) -> crate::model::Result<()> {
        let Some((k0, _)) = layers.first() else {
            return Ok(());
        };
        let (b, kv, t, d) = k0.dims4()?;
        if kv != self.kv_heads || d != self.head_dim || dest.len() != b * t {
            return Err(candle_core::Error::Msg(format!(
                "paged KV store: a cache of {:?} for {} positions into a pool of {} heads of {}",
                k0.dims(),
                dest.len(),
                self.kv_heads,
                self.head_dim
            ))
            .into());
        }
        let mut rows = Vec::with_capacity(b * kv * t);
        for bi in 0..b {
            for g in 0..kv {
                for ti in 0..t {
                    let (blk, row) = dest[bi * t + ti];
                    rows.push(if blk == SCRATCH {
                        SCRATCH
                    } else {
                        self.row(blk, g, row)
                    });
                }
            }
        }
        // The scatter's index repeats each row's destination over the head dim: a prefill of
        // many long prompts writes it a chunk of rows at a time, not all at once.
        let flat: Vec<(Tensor, Tensor)> = layers
            .iter()
            .map(|(k, v)| {
                let f = |x: &Tensor| x.contiguous()?.reshape((b * kv * t, d));
                Ok((f(k)?, f(v)?))
            })
            .collect::<candle_core::Result<_>>()?;
        for (n, part) in rows.chunks(chunk.max(1)).enumerate() {
            let index = self.write_index(part, k0.device())?;
            let at = n * chunk.max(1);
            for (i, (k, v)) in flat.iter().enumerate() {
                self.write(i, 0, &k.narrow(0, at, part.len())?, &index)?;
                self.write(i, 1, &v.narrow(0, at, part.len())?, &index)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two layers of 2 KV heads of 8.
    fn tiny_config() -> QwenConfig {
        let json = r#"{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}"#;
        QwenConfig::from_json(json, std::path::Path::new("config.json")).unwrap()
    }

    /// Every block is free, or held by exactly as many sequences as list it.
    fn check_counts(pool: &BlockPool, seqs: &[&SeqBlocks]) {
        let mut held = vec![0u32; pool.refs.len()];
        held[0] = 1;
        for s in seqs {
            assert_eq!(s.table.len(), pool.blocks_for(s.len));
            for &b in &s.table {
                held[b as usize] += 1;
            }
        }
        assert_eq!(held, pool.refs);
        let free: Vec<u32> = (0..pool.refs.len() as u32)
            .filter(|&b| pool.refs[b as usize] == 0)
            .collect();
        let mut listed = pool.free.clone();
        listed.sort_unstable();
        assert_eq!(listed, free);
    }

    #[test]
    fn allocation_append_and_release_keep_the_counts() {
        let mut pool = BlockPool::new(6, 32).unwrap();
        assert_eq!((pool.capacity(), pool.free_blocks()), (5, 5));
        let mut a = pool.allocate(40).unwrap(); // two blocks, 8 rows of the second
        let b = pool.allocate(32).unwrap(); // one whole block
        check_counts(&pool, &[&a, &b]);
        assert_eq!(pool.free_blocks(), 2);
        // Appending into a private partial block takes nothing.
        assert_eq!(pool.append_needs(&a), 0);
        let ap = pool.append(&mut a).unwrap();
        assert_eq!((ap.row, ap.copy, a.len()), (8, None, 41));
        assert_eq!(ap.block, a.table()[1]);
        // A full last block: the next position starts a new one.
        let mut b = b;
        assert_eq!(pool.append_needs(&b), 1);
        let bp = pool.append(&mut b).unwrap();
        assert_eq!((bp.row, bp.copy, b.table().len()), (0, None, 2));
        check_counts(&pool, &[&a, &b]);
        pool.release(a);
        check_counts(&pool, &[&b]);
        pool.release(b);
        assert_eq!(pool.free_blocks(), 5);
        check_counts(&pool, &[]);
    }

    #[test]
    fn running_out_is_an_error_that_takes_nothing() {
        let mut pool = BlockPool::new(4, 32).unwrap();
        let a = pool.allocate(64).unwrap();
        let err = pool.allocate(33).unwrap_err();
        assert_eq!(
            err,
            PagedError::Exhausted {
                needed: 1,
                free: 1,
                total: 3,
                block: 32
            }
        );
        // Nothing was taken by the failed call.
        assert_eq!(pool.free_blocks(), 1);
        let mut c = pool.allocate(32).unwrap();
        assert!(matches!(
            pool.append(&mut c),
            Err(PagedError::Exhausted { needed: 1, .. })
        ));
        assert_eq!(c.len(), 32, "a failed append leaves the sequence as it was");
        check_counts(&pool, &[&a, &c]);
        assert!(matches!(
            BlockPool::new(4, 48),
            Err(PagedError::BlockSize(48))
        ));
    }

    #[test]
    fn forks_share_full_blocks_and_copy_only_the_partial_one() {
        let mut pool = BlockPool::new(10, 32).unwrap();
        let prompt = pool.allocate(70).unwrap(); // blocks: full, full, 6 rows
        let mut forks: Vec<SeqBlocks> = (0..3).map(|_| pool.fork(&prompt)).collect();
        assert_eq!(pool.free_blocks(), 6, "forks take no block");
        for f in &forks {
            assert_eq!(f.table(), prompt.table());
        }
        // The first fork to write copies the shared partial block, and only it.
        let ap = pool.append(&mut forks[0]).unwrap();
        let last = prompt.table()[2];
        assert_eq!(ap.copy, Some((last, ap.block)));
        assert_eq!(ap.row, 6);
        assert_eq!(forks[0].table()[..2], prompt.table()[..2]);
        assert_eq!(pool.refs(prompt.table()[0]), 4);
        assert_eq!(pool.refs(last), 3);
        // Once the prompt's own handle and the other forks have their copies, the last holder
        // of the partial block writes in place.
        pool.release(prompt);
        let ap1 = pool.append(&mut forks[1]).unwrap();
        assert!(ap1.copy.is_some());
        assert_eq!(pool.refs(last), 1);
        assert_eq!(pool.append_needs(&forks[2]), 0);
        let ap2 = pool.append(&mut forks[2]).unwrap();
        assert_eq!((ap2.block, ap2.copy), (last, None));
        check_counts(&pool, &[&forks[0], &forks[1], &forks[2]]);
        for f in forks {
            pool.release(f);
        }
        assert_eq!(pool.free_blocks(), pool.capacity());
    }

    #[test]
    fn a_budget_gives_whole_blocks_and_refuses_too_little() {
        let cfg = tiny_config();
        let per = PagedKv::block_bytes(&cfg, 4, 32);
        let kv =
            PagedKv::for_budget(&cfg, DType::F32, &Device::Cpu, 5 * per as u128 + 7, 32).unwrap();
        assert_eq!(kv.pool.capacity(), 4);
        let small = PagedKv::for_budget(&cfg, DType::F32, &Device::Cpu, per as u128, 32);
        assert!(matches!(
            small,
            Err(crate::model::ModelError::Paged(PagedError::TooSmall {
                blocks: 1,
                ..
            }))
        ));
    }

    /// A pool of E4M3 bytes (an FP8 cache) takes bytes as they are and rounds numbers to their
    /// bytes; a pool of numbers refuses bytes (their values would be read as small integers).
    #[test]
    fn a_byte_pool_stores_e4m3_bytes_and_a_number_pool_refuses_them() {
        let cfg = tiny_config();
        let kv = PagedKv::new(&cfg, DType::U8, &Device::Cpu, 3, 32).unwrap();
        let d = kv.head_dim();
        let x: Vec<f32> = (0..2 * d).map(|i| (i as f32 - 7.5) * 37.3).collect();
        let src = Tensor::from_vec(x, (2, d), &Device::Cpu).unwrap();
        let want = crate::fused::to_fp8_bytes(&src).unwrap();
        let index = kv
            .write_index(&[kv.row(1, 0, 0), kv.row(2, 1, 5)], &Device::Cpu)
            .unwrap();
        kv.write(0, 0, &src, &index).unwrap();
        kv.write(0, 1, &want, &index).unwrap();
        let (k, v) = kv.layer(0).unwrap();
        for (pool, what) in [(k, "numbers"), (v, "bytes")] {
            let rows = pool
                .index_select(&index.narrow(1, 0, 1).unwrap().squeeze(1).unwrap(), 0)
                .unwrap();
            assert_eq!(
                rows.to_vec2::<u8>().unwrap(),
                want.to_vec2::<u8>().unwrap(),
                "{what}"
            );
        }
        let numbers = PagedKv::new(&cfg, DType::F32, &Device::Cpu, 3, 32).unwrap();
        let err = numbers.write(0, 0, &want, &index).unwrap_err();
        assert!(err.to_string().contains("E4M3 bytes"), "{err}");
    }

    /// Writes land in the rows the layout names, copies move whole blocks, and padding goes to
    /// the scratch block.
    #[test]
    fn store_write_and_copy_address_the_layout() {
        let cfg = tiny_config();
        let mut kv = PagedKv::new(&cfg, DType::F32, &Device::Cpu, 4, 32).unwrap();
        let (g, d) = (kv.kv_heads(), kv.head_dim());
        let seq = kv.pool.allocate(2).unwrap();
        // a dense prefill cache of one row, 3 columns (the first padding)
        let t = 3;
        let data: Vec<f32> = (0..g * t * d).map(|i| i as f32 + 1.0).collect();
        let k = Tensor::from_vec(data, (1, g, t, d), &Device::Cpu).unwrap();
        let layers: Vec<_> = (0..cfg.num_hidden_layers)
            .map(|_| (k.clone(), (&k * 2.0).unwrap()))
            .collect();
        let blk = seq.table()[0];
        let dest = [(SCRATCH, 0), (blk, 0), (blk, 1)];
        kv.store(&layers, &dest).unwrap();
        // a store a few rows at a time writes the same pool
        let whole = kv.layer(1).unwrap().0.to_vec2::<f32>().unwrap();
        let other = PagedKv::new(&cfg, DType::F32, &Device::Cpu, 4, 32).unwrap();
        other.store_by(&layers, &dest, 4).unwrap();
        assert_eq!(other.layer(1).unwrap().0.to_vec2::<f32>().unwrap(), whole);
        let pool_k = kv.layer(1).unwrap().0.to_vec2::<f32>().unwrap();
        let pool_v = kv.layer(1).unwrap().1.to_vec2::<f32>().unwrap();
        for h in 0..g {
            for c in 1..t {
                let want: Vec<f32> = (0..d).map(|x| ((h * t + c) * d + x) as f32 + 1.0).collect();
                let r = kv.row(blk, h, c - 1) as usize;
                assert_eq!(pool_k[r], want);
                assert_eq!(pool_v[r], want.iter().map(|x| x * 2.0).collect::<Vec<_>>());
            }
        }
        // copy the block elsewhere: every row of it, every layer
        let other = kv.pool.allocate(1).unwrap().table()[0];
        kv.copy_blocks(&[(blk, other)]).unwrap();
        let after = kv.layer(0).unwrap().0.to_vec2::<f32>().unwrap();
        for h in 0..g {
            for r in 0..32 {
                assert_eq!(
                    after[kv.row(other, h, r) as usize],
                    after[kv.row(blk, h, r) as usize]
                );
            }
        }
    }
}
