//! Data parallelism over micro-batches on the CPU.
//!
//! A training step of a small model is hundreds of small ops (a tiny Qwen's backward alone is
//! ~400), and splitting each of them over the cores costs more in wake-ups than it saves: on
//! 2 cores a tiny model's step ran no faster with 2 threads than with 1 (`acpo bench
//! train-step`). Micro-batches are independent until their gradients are summed, so [`map`]
//! runs them side by side instead, each on its own share of the cores: with `W` worker threads
//! and `k = min(W, n)` micro-batches in flight, each runs inside a private rayon pool of `W / k`
//! threads. The ops inside see that pool (gemm's and the fused kernels' splits go to it, and a
//! one-thread pool runs them on the calling thread), so nothing queues behind a shared pool.
//!
//! Results come back in micro-batch order, so a caller that folds them in that order (the
//! trainer sums gradients) gets the same numbers whatever the number of threads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Worker threads available to [`map`]: the size of rayon's global pool (all cores, or
/// `RAYON_NUM_THREADS`; `reproduce --jobs N` sets it to 1 and runs experiments side by side).
pub fn workers() -> usize {
    rayon::current_num_threads()
}

/// Sets of pools by (how many, threads each).
type PoolCache = Mutex<HashMap<(usize, usize), Arc<Vec<rayon::ThreadPool>>>>;

/// `k` pools of `each` threads, built once per shape and kept for the process.
fn pools(k: usize, each: usize) -> Arc<Vec<rayon::ThreadPool>> {
    static POOLS: OnceLock<PoolCache> = OnceLock::new();
    let mut cache = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    cache
        .entry((k, each))
        .or_insert_with(|| {
            Arc::new(
                (0..k)
                    .map(|i| {
                        rayon::ThreadPoolBuilder::new()
                            .num_threads(each)
                            .thread_name(move |t| format!("acpo-mb{i}-{t}"))
                            .build()
                            .expect("invariant: building a rayon pool only fails on spawn errors")
                    })
                    .collect(),
            )
        })
        .clone()
}

/// `f(0), f(1), …, f(n − 1)`, in that order, computed side by side when `side_by_side` (the
/// caller's work is on the CPU) and there are at least two workers and two items; otherwise
/// one after another on the calling thread, with each op free to use the whole pool.
///
/// Items are handed out one at a time, so uneven micro-batches balance. A panic in `f`
/// propagates to the caller.
pub fn map<R, F>(n: usize, side_by_side: bool, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize) -> R + Sync,
{
    let w = workers();
    if !side_by_side || n < 2 || w < 2 {
        return (0..n).map(f).collect();
    }
    let k = w.min(n);
    let pools = pools(k, w / k);
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    let work = |pool: &rayon::ThreadPool| {
        pool.install(|| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            let r = f(i);
            *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        })
    };
    std::thread::scope(|s| {
        for pool in &pools[1..] {
            s.spawn(|| work(pool));
        }
        work(&pools[0]);
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("invariant: every index below n was taken by a worker")
        })
        .collect()
}

/// [`map`] over the micro-batches of `rows`: `f(start, len)` for consecutive pieces of `micro`
/// rows (the last may be shorter), results in row order.
pub fn map_micro_batches<R, F>(
    rows: std::ops::Range<usize>,
    micro: usize,
    side_by_side: bool,
    f: F,
) -> Vec<R>
where
    R: Send,
    F: Fn(usize, usize) -> R + Sync,
{
    let starts: Vec<usize> = rows.clone().step_by(micro).collect();
    map(starts.len(), side_by_side, |i| {
        f(starts[i], micro.min(rows.end - starts[i]))
    })
}
