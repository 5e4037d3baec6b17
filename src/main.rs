//! The `acpo` binary: parse flags, call the library, map the outcome to an exit code.
//!
//! Exit codes: 0 success, 1 a check failed (e.g. a checksum mismatch), 2 a usage or input error.

use std::process::ExitCode;

mod cli;

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

    pub fn of(ok: bool) -> Outcome {
        if ok {
            Outcome::Success
        } else {
            Outcome::CheckFailed
        }
    }
}

/// mimalloc, counted: `device::PeakMeter` reads the bytes in use on the CPU from the count.
#[global_allocator]
static ALLOCATOR: acpo::device::Counting<mimalloc::MiMalloc> =
    acpo::device::Counting(mimalloc::MiMalloc);

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (libmimalloc-sys 0.1.49, pinned in
/// Cargo.toml; the crate does not export the constant).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Never return freed pages to the OS: every step allocates tensors of the same sizes, and
/// returned pages are zeroed again by the kernel on the next touch. Peak memory is unchanged.
/// The option is only set if its slot holds a known default (the header says 10 ms; the vendored
/// v3 build reports 1000 ms), so a renumbered
/// enum in another mimalloc leaves the allocator at its defaults instead of misconfiguring it.
fn keep_freed_memory() {
    // SAFETY: plain getters/setters of mimalloc's global options, called before any threads.
    unsafe {
        if matches!(
            libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY),
            10 | 1000
        ) {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
}

/// Rust ignores SIGPIPE, so printing into a closed pipe (`acpo bench ... | head -1`) panics.
/// With the default action the process ends silently instead, as Unix tools do; result files
/// are written atomically, so none is left half-written.
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: sets a signal disposition to its default, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// candle splits large elementwise ops over a thread pool of its own, whose workers spin for
/// ~25,000 iterations after every op. Beside rayon's pool (gemm, src/fused/, and the
/// micro-batches of src/parallel.rs) the spinning worker held a core for most of a tiny model's
/// training step (docs/PERFORMANCE.md, "Threads"). With one thread that pool is empty and its ops
/// run where they are called. An explicit `CANDLE_NUM_THREADS` is left as it is.
fn single_elementwise_pool() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // Before any other thread exists, and before candle first reads it.
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// The error and its causes in one line, each cause once: most of the library's errors already
/// name their cause (`{path}: {source}`), and printing the chain again would repeat it.
fn message(err: &anyhow::Error) -> String {
    let mut msg = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !msg.contains(&cause) {
            msg.push_str(": ");
            msg.push_str(&cause);
        }
    }
    msg
}

fn main() -> ExitCode {
    default_sigpipe();
    single_elementwise_pool();
    keep_freed_memory();
    let cli = cli::Cli::from_args();
    match cli::run(cli) {
        Ok(outcome) => outcome.exit_code(),
        Err(err) => {
            eprintln!("error: {}", message(&err));
            ExitCode::from(2)
        }
    }
}
