//! The device's memory, as the work on it sees it: a meter of the bytes in use and their
//! high-water mark, and a trace of both by phase (issue #33: where a train step's peak comes
//! from; issue #34: each phase of a run's peak).
//!
//! - On CUDA the meter reads the allocator itself: candle allocates with `cuMemAllocAsync` from
//!   the device's default memory pool, whose `USED_MEM_CURRENT` and `USED_MEM_HIGH` attributes
//!   are what its allocations hold now and at most (PyTorch's `memory_allocated` and
//!   `max_memory_allocated`).
//! - On the CPU, in a process whose global allocator is [`Counting`] (the `acpo` binary's,
//!   `main.rs`), it reads the bytes the allocator has handed out and not taken back, and their
//!   high-water mark: the tensors alive, as the CUDA pool counts them, and not the pages the
//!   allocator keeps for reuse. A trace on the CPU then shows release as well as growth, so it
//!   can say what a step would hold on a GPU before one is lent (issue #44).
//! - Elsewhere on the CPU it reads the process's resident set (`VmRSS`) and its peak (`VmHWM`,
//!   reset through `/proc/self/clear_refs`). That counts what is not the model's too (the
//!   binary, the allocator's caches), and an allocator that keeps freed pages keeps them in the
//!   resident set: such a trace shows growth, not release.
//!
//! A trace is process-wide and off by default: [`mark`] costs one atomic load when no trace is
//! running, so the model and the trainer mark their phases unconditionally and a benchmark (or a
//! run) turns tracing on around the work it measures.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use candle_core::Device;
use serde::{Deserialize, Serialize};

/// A global allocator that counts the bytes it has handed out and not taken back, and their
/// high-water mark, around the allocator `A` that does the work: what [`PeakMeter`] reads on the
/// CPU. Two relaxed atomic operations an allocation; the counts are process-wide.
pub struct Counting<A>(pub A);

/// Heap bytes in use, and the most in use since the last [`PeakMeter::reset`].
static HEAP_LIVE: AtomicU64 = AtomicU64::new(0);
static HEAP_HIGH: AtomicU64 = AtomicU64::new(0);

fn heap_grew(bytes: usize) {
    let now = HEAP_LIVE.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
    HEAP_HIGH.fetch_max(now, Ordering::Relaxed);
}

fn heap_shrank(bytes: usize) {
    HEAP_LIVE.fetch_sub(bytes as u64, Ordering::Relaxed);
}

/// Whether this process allocates through [`Counting`] (it has counted something).
fn heap_counted() -> bool {
    HEAP_HIGH.load(Ordering::Relaxed) > 0
}

// SAFETY: every call is passed to `A` unchanged; the counts only read sizes.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            heap_grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            heap_grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(ptr, layout) };
        heap_shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() && new_size >= layout.size() {
            heap_grew(new_size - layout.size());
        } else if !p.is_null() {
            heap_shrank(layout.size() - new_size);
        }
        p
    }
}

/// The memory meter of one device.
#[derive(Clone)]
pub struct PeakMeter {
    device: Device,
}

impl PeakMeter {
    pub fn new(device: &Device) -> PeakMeter {
        PeakMeter {
            device: device.clone(),
        }
    }

    /// What the meter reads: the CUDA allocator, the counted heap or the process's resident set.
    pub fn source(&self) -> &'static str {
        if self.device.is_cuda() {
            "cuda allocator high-water mark"
        } else if heap_counted() {
            "heap bytes in use (counting allocator)"
        } else {
            "process peak resident set"
        }
    }

    /// Starts a measurement: the high-water mark is reset to what is in use now.
    pub fn reset(&self) {
        if self.device.is_cuda() {
            cuda::reset(&self.device);
        } else if heap_counted() {
            HEAP_HIGH.store(HEAP_LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
        } else {
            // Writing 5 resets VmHWM to the current RSS (Linux ≥ 4.0); elsewhere the peak
            // is the process's since it started.
            let _ = std::fs::write("/proc/self/clear_refs", "5");
        }
    }

    /// Waits until the device has finished the work queued on it (nothing to wait for on the
    /// CPU, whose ops run as they are called).
    pub fn wait(&self) {
        if self.device.is_cuda() {
            let _ = self.device.synchronize();
        }
    }

    /// Bytes in use now; None where the device cannot say.
    pub fn current(&self) -> Option<u64> {
        if self.device.is_cuda() {
            cuda::used(&self.device, false)
        } else if heap_counted() {
            Some(HEAP_LIVE.load(Ordering::Relaxed))
        } else {
            proc_status_kib("VmRSS:").map(|k| k * 1024)
        }
    }

    /// The most bytes in use at once since [`PeakMeter::reset`].
    pub fn peak(&self) -> Option<u64> {
        if self.device.is_cuda() {
            cuda::used(&self.device, true)
        } else if heap_counted() {
            Some(HEAP_HIGH.load(Ordering::Relaxed))
        } else {
            proc_status_kib("VmHWM:").map(|k| k * 1024)
        }
    }

    /// Bytes the device can still hand out (CUDA: what the driver reports free plus what the
    /// pool holds unused); None on the CPU.
    pub fn free(&self) -> Option<u64> {
        cuda::free(&self.device)
    }
}

/// Bytes this process can still take from the host: the least of the system's available memory
/// (`MemAvailable` of /proc/meminfo), what its memory cgroup's limit leaves (a SLURM job's or a
/// container's, cgroup v2 or v1) and what its address-space limit (`ulimit -v`) leaves; None
/// where none of them says.
pub fn host_available() -> Option<u64> {
    [meminfo_available(), cgroup_left(), address_space_left()]
        .into_iter()
        .flatten()
        .min()
}

fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line["MemAvailable:".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The memory cgroup's limit less its usage. v2: the `0::PATH` line of /proc/self/cgroup under
/// /sys/fs/cgroup (`memory.max` is `max` when unlimited); v1: the memory controller's line.
fn cgroup_left() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read =
        |path: String| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_end_matches('/');
        let (limit, usage) = if controllers.is_empty() {
            let dir = format!("/sys/fs/cgroup{path}");
            (
                read(format!("{dir}/memory.max")),
                read(format!("{dir}/memory.current")),
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            // Inside a container the controller's mount is the cgroup itself, not the path.
            let dir = [
                "/sys/fs/cgroup/memory".to_string(),
                format!("/sys/fs/cgroup/memory{path}"),
            ]
            .into_iter()
            .find(|d| std::path::Path::new(&format!("{d}/memory.limit_in_bytes")).exists())?;
            (
                read(format!("{dir}/memory.limit_in_bytes")),
                read(format!("{dir}/memory.usage_in_bytes")),
            )
        } else {
            continue;
        };
        if let (Some(limit), Some(usage)) = (limit, usage) {
            return Some(limit.saturating_sub(usage));
        }
    }
    None
}

/// The address-space limit (`RLIMIT_AS`) less the process's virtual size; None when unlimited.
fn address_space_left() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and reads nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let used = proc_status_kib("VmSize:")? * 1024;
    Some(limit.rlim_cur.saturating_sub(used))
}

/// Bytes `device` can still hand out: the host's available memory on the CPU, the free device
/// memory on CUDA; None where it cannot say.
pub fn available(device: &Device) -> Option<u64> {
    if device.is_cuda() {
        PeakMeter::new(device).free()
    } else {
        host_available()
    }
}

fn proc_status_kib(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// One reading of a trace: the bytes in use when `phase` ended, the most in use at once since
/// the previous reading (during the phase), and the phase's wall time: from the previous
/// reading to this one, each taken once the device has finished the work queued before it (on
/// CUDA, reading the pool waits for the stream).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    pub phase: String,
    pub live: Option<u64>,
    pub peak: Option<u64>,
    #[serde(default)]
    pub seconds: Option<f64>,
    /// The phase's time by part ([`part`]), each part's seconds summed over its occurrences, in
    /// the order each first ended; the phase's time after its last part (a layer's: its
    /// gradients joining the sums) is `seconds` less their sum. Empty where the phase has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
}

/// A part of a traced phase ([`part`]): its name and its seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub name: String,
    pub seconds: f64,
}

struct Trace {
    meter: PeakMeter,
    marks: Vec<Mark>,
    since: std::time::Instant,
    /// The parts of the phase under way, and when the last one ended.
    parts: Vec<Part>,
    part_since: std::time::Instant,
}

impl Trace {
    /// `seconds` more in the phase's part `name` (a new part after the others, the first time).
    fn add_to_part(&mut self, name: &str, seconds: f64) {
        match self.parts.iter_mut().find(|p| p.name == name) {
            Some(p) => p.seconds += seconds,
            None => self.parts.push(Part {
                name: name.to_string(),
                seconds,
            }),
        }
    }
}

static TRACING: AtomicBool = AtomicBool::new(false);
static TRACE: Mutex<Option<Trace>> = Mutex::new(None);

/// Starts tracing `device`'s memory (replacing a trace already running): the high-water mark is
/// reset, and every [`mark`] until [`finish`] is recorded.
pub fn start(device: &Device) {
    let meter = PeakMeter::new(device);
    meter.reset();
    *TRACE.lock().unwrap_or_else(|p| p.into_inner()) = Some(Trace {
        meter,
        marks: Vec::new(),
        since: std::time::Instant::now(),
        parts: Vec::new(),
        part_since: std::time::Instant::now(),
    });
    TRACING.store(true, Ordering::Release);
}

/// The end of phase `phase()` in a running trace: reads the memory in use, the peak and the
/// time since the previous mark, then resets the peak and the clock (so the reading itself is
/// in no phase's time). Costs one atomic load when no trace runs (`phase` is
/// not called).
pub fn mark(phase: impl FnOnce() -> String) {
    if !TRACING.load(Ordering::Acquire) {
        return;
    }
    if let Some(trace) = TRACE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        let (live, peak) = (trace.meter.current(), trace.meter.peak());
        let seconds = trace.since.elapsed().as_secs_f64();
        let parts = std::mem::take(&mut trace.parts);
        trace.marks.push(Mark {
            phase: phase(),
            live,
            peak,
            seconds: Some(seconds),
            parts,
        });
        trace.meter.reset();
        trace.since = std::time::Instant::now();
        trace.part_since = trace.since;
    }
}

/// The parts a traced forward and a checkpointed layer's backward are split into
/// ([`part`]): the forward's matrix products, its attention and the rest
/// (element-wise passes: norms, RoPE, SwiGLU, residual adds, copies), the seed of the layer's
/// backward ([`crate::fused::backward_seed`]), and in the backward the attention's kernels
/// ([`crate::fused::flash_attention`]'s backward) and the rest: under autograd its matrix
/// products, which the trace cannot split from candle's element-wise passes and adds
/// (`tools/gpu/report.py` estimates them from their FLOPs at the forward's measured rate);
/// with the layer's backward by hand (issue #59) each kind apart: its matrix products, its
/// element-wise passes (the seed's own backward among them, as under autograd it is in the
/// rest: [`SEED`] is the seed's value on either path) and its weights' gradients handed to
/// their masters (a cast to the masters' f32 on the GPU, the pass cuBLAS with beta = 1 into the
/// sums would save); the embedding's backward by hand likewise (its pass, element-wise, and its
/// gradient to the master).
pub const FORWARD_MATMUL: &str = "forward: matrix products";
pub const FORWARD_ATTENTION: &str = "forward: attention";
pub const FORWARD_ELEMENTWISE: &str = "forward: element-wise";
pub const SEED: &str = "backward seed";
pub const BACKWARD_ATTENTION: &str = "backward: attention";
pub const BACKWARD_REST: &str = "backward: matrix products and element-wise";
pub const BACKWARD_MATMUL: &str = "backward: matrix products";
pub const BACKWARD_ELEMENTWISE: &str = "backward: element-wise";
pub const TO_MASTERS: &str = "backward: weight gradients to the masters";

/// The end of a part of the phase under way in a running trace: once the device has finished
/// the work queued before it, the time since the previous part ended (or the phase began) is
/// added to the part `name` of the next [`mark`] (a layer's backward: its recompute's matrix
/// products, element-wise passes and attention, the seed, the attention's backward and the
/// rest of it). The peak and the phase's clock go on. Costs one atomic load when no trace runs;
/// in a trace, a wait for the device per part (a few µs of idle device each, counted in the
/// phase). Parts name work of one micro-batch at a time, as a GPU runs them (side by side on
/// the CPU, they interleave).
pub fn part(name: &'static str) {
    if !TRACING.load(Ordering::Acquire) {
        return;
    }
    if let Some(trace) = TRACE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        trace.meter.wait();
        let now = std::time::Instant::now();
        let seconds = (now - trace.part_since).as_secs_f64();
        trace.part_since = now;
        trace.add_to_part(name, seconds);
    }
}

/// Adds the seconds of part `from` of the phase under way to part `into` and drops `from`: for
/// a caller that knows what a callee's [`part`] timed better than the callee does (the layer's
/// backward by hand: what [`crate::fused::flash_attention`]'s backward calls the rest of the
/// backward is, there, the seed's own backward, element-wise passes). Whether it folded: false
/// when no trace runs or `from` has no time in this phase. (Micro-batches traced side by side on
/// the CPU share the phase's parts, so one's fold can take another's; the GPU runs them in turn.)
pub fn fold_part(from: &'static str, into: &'static str) -> bool {
    if !TRACING.load(Ordering::Acquire) {
        return false;
    }
    let mut trace = TRACE.lock().unwrap_or_else(|p| p.into_inner());
    let Some(trace) = trace.as_mut() else {
        return false;
    };
    let Some(at) = trace.parts.iter().position(|p| p.name == from) else {
        return false;
    };
    let seconds = trace.parts.remove(at).seconds;
    trace.add_to_part(into, seconds);
    true
}

/// Stops the trace and returns its marks (none when no trace ran).
pub fn finish() -> Vec<Mark> {
    TRACING.store(false, Ordering::Release);
    TRACE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .map(|t| t.marks)
        .unwrap_or_default()
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::Device;

    /// The default memory pool of the device `device` runs on.
    fn pool(device: &Device) -> Option<sys::CUmemoryPool> {
        let Device::Cuda(dev) = device else {
            return None;
        };
        let cu_device = dev.cuda_stream().context().cu_device();
        let mut pool = std::mem::MaybeUninit::uninit();
        // SAFETY: the out-pointer is valid; the driver writes a pool handle on success.
        let ok = unsafe { sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), cu_device) };
        // SAFETY: written on success.
        (ok == sys::CUresult::CUDA_SUCCESS).then(|| unsafe { pool.assume_init() })
    }

    fn attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Option<u64> {
        let mut value: u64 = 0;
        // SAFETY: these attributes are cuuint64_t, written into `value`.
        let ok = unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) };
        (ok == sys::CUresult::CUDA_SUCCESS).then_some(value)
    }

    pub(super) fn used(device: &Device, high: bool) -> Option<u64> {
        let pool = pool(device)?;
        device.synchronize().ok()?;
        attribute(
            pool,
            if high {
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH
            } else {
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT
            },
        )
    }

    pub(super) fn reset(device: &Device) {
        if let Some(pool) = pool(device) {
            let _ = device.synchronize();
            let mut zero: u64 = 0;
            // SAFETY: resetting USED_MEM_HIGH takes a cuuint64_t zero.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                );
            }
        }
    }

    /// Free device memory plus what the pool reserves but does not use.
    pub(super) fn free(device: &Device) -> Option<u64> {
        let Device::Cuda(dev) = device else {
            return None;
        };
        device.synchronize().ok()?;
        let (free, _total) = dev.cuda_stream().context().mem_get_info().ok()?;
        let pool = pool(device)?;
        let reserved = attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        )?;
        let used = attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        )?;
        Some(free as u64 + reserved.saturating_sub(used))
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use candle_core::Device;

    pub(super) fn used(_: &Device, _: bool) -> Option<u64> {
        None
    }

    pub(super) fn reset(_: &Device) {}

    pub(super) fn free(_: &Device) -> Option<u64> {
        None
    }
}
