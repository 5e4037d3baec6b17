//! The CUDA kernels checked without a GPU: `kernels/check/*.cu` built for the CPU emulator
//! (`kernels/check/cuda_emu.hpp`, `-DACPO_EMU`) and run, so that every kernel (the tensor-core
//! layouts, pipelines and masking of flash attention; RMSNorm, SwiGLU, RoPE, the softmax, the
//! log-probabilities, the vocabulary chunks and the sampler here; AdamW in tests/it/optim.rs) is checked against a float64 reference on every
//! machine, not only on the GPU sessions some tasks are lent (tests/it/cuda.rs runs there); and
//! the emulator itself, which must refuse what a GPU refuses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A check program built for the emulator, in a temp dir that lives as long as it.
struct Emulated {
    _dir: tempfile::TempDir,
    exe: PathBuf,
}

impl Emulated {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.exe)
            .args(args)
            // the programs exit without freeing what the OS takes back anyway
            .env("ASAN_OPTIONS", "detect_leaks=0")
            .output()
            .expect("run")
    }
}

/// Builds `kernels/check/<name>.cu` for the emulator with the system's C++ compiler (with
/// AddressSanitizer when `asan`); None (after saying why) where no C++ compiler, or no
/// AddressSanitizer runtime, is found.
fn build_emulated(test: &str, name: &str, asan: bool) -> Option<Emulated> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let dir = tempfile::tempdir().expect("a temp dir");
    if asan && !asan_works(&cxx, dir.path()) {
        super::skip(
            test,
            format_args!("`{cxx}` cannot build with -fsanitize=address (no libasan)"),
        );
        return None;
    }
    let exe = dir.path().join(name);
    let flags: &[&str] = if asan {
        &["-O1", "-g", "-fsanitize=address"]
    } else {
        &["-O2"]
    };
    let built = Command::new(&cxx)
        .args(flags)
        .args(["-std=c++17", "-DACPO_EMU", "-x", "c++"])
        .arg("-I")
        .arg(root.join("kernels"))
        .arg(root.join("kernels/check").join(format!("{name}.cu")))
        .arg("-o")
        .arg(&exe)
        .output();
    let built = match built {
        Ok(out) => out,
        Err(e) => {
            super::skip(test, format_args!("no C++ compiler `{cxx}` ({e})"));
            return None;
        }
    };
    assert!(
        built.status.success(),
        "{name}.cu does not build for the emulator:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    Some(Emulated { _dir: dir, exe })
}

/// Builds `kernels/check/<name>.cu` for the emulator and runs it with `args`; None (after
/// saying why) where no C++ compiler is found.
pub(super) fn run_emulated(test: &str, name: &str, args: &[&str]) -> Option<Output> {
    build_emulated(test, name, false).map(|prog| prog.run(args))
}

/// Whether `cxx` links a program with AddressSanitizer.
fn asan_works(cxx: &str, dir: &Path) -> bool {
    let src = dir.join("probe.cc");
    std::fs::write(&src, "int main() { return 0; }\n").expect("write the probe");
    Command::new(cxx)
        .args(["-fsanitize=address", "-o"])
        .arg(dir.join("probe"))
        .arg(&src)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every flash attention kernel against the float64 reference in the emulator: the tensor-core
/// forward, dQ and dK/dV under four schedules (a fair one, one warp lagging behind the others,
/// cp.async copies landing late or as soon as issued: a missing barrier or wait fails one of
/// them), the row kernels' forward and backward, the split-K decode, and the pipelined decode
/// (under the four schedules at small shapes, once at the issue's), and its paged instance.
#[test]
fn flash_kernels_match_the_float64_reference_in_the_emulator() {
    let test = "flash_kernels_match_the_float64_reference_in_the_emulator";
    let Some(prog) = build_emulated(test, "flash_check", false) else {
        return;
    };
    let out = prog.run(&["--seeds", "4"]);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout.contains("all checks ok"),
        "the emulated flash kernels fail their checks:\n{stdout}\n{stderr}"
    );
    for kernel in ["mma fwd", "mma bwd", "row fwd", "row bwd", "decode"] {
        assert!(
            stdout.contains(kernel),
            "no check of `{kernel}` ran:\n{stdout}"
        );
    }
    // The pipelined decode (kernels/flash_decode.cu): against float64 at the decode shapes that
    // matter (one row of 8,192 keys, 64 rows of 1,024 and 2,047, ragged rows), and bit for bit a
    // row alone against the same row in a ragged batch, and any chunks per block against one.
    for check in [
        "decode pipe, rows of 8192-8192 keys B1 H16 KV8",
        "decode pipe, rows of 1024-1024 keys B64",
        "decode pipe, rows of 2047-2047 keys B64",
        "decode pipe, rows of 1024-2047 keys B64",
        "decode pipe f32, rows of",
        "decode pipe, rows of 300-300 keys B2 H14 KV2 T1 past299 D128 pad170 +blind seq",
        "decode pipe, rows of 33-201 keys B3 H28 KV4",
        "decode pipe chunks a block 8 vs 1 B1 H16 KV8 past8191",
        "decode pipe row alone vs in a batch B64",
        "decode pipe f32 row alone vs in a batch",
        // through a paged pool's block tables, bit for bit the dense kernel on the same keys
        "decode paged (blocks of 32), rows of 1024-2047 keys B64",
        "decode paged blocks of 32 vs the dense kernel B64",
        "decode paged blocks of 64 vs the dense kernel",
        "decode paged blocks of 32 vs the dense kernel B3 H28 KV4",
        "decode paged f32 blocks of 32 vs the dense kernel",
        // the instances compiled for 2 and 4 query heads a KV head (the host's for Qwen3),
        // checked against float64 and bit for bit against the one for any count
        "decode pipe, rows of 33-201 keys B3 H16 KV4 T1 past200 D128",
        "decode pipe compiled for G 2 vs for any G",
        "decode pipe compiled for G 4 vs for any G",
        "decode pipe f32 compiled for G 4 vs for any G",
    ] {
        assert!(stdout.contains(check), "no check `{check}` ran:\n{stdout}");
    }
    assert!(
        stdout.matches("the same bits ok").count() >= 4 * (10 + 4) + 4,
        "the pipelined decode's bit-for-bit checks did not all run under the four schedules:\n{stdout}"
    );
}

/// The kernel checks of `ops_check.cu`, each of which must have run.
const OPS_CHECKS: [&str; 35] = [
    "rms_norm fwd f32",
    "rms_norm fwd bf16",
    "rms_norm bwd dx",
    "rms_norm bwd dw (two-pass)",
    "swiglu fwd",
    "swiglu bwd",
    "rope f32 BHTD->BHTD",
    "rope bf16 BTHD->BHTD",
    "rope bf16 BHTD->BTHD sign -1",
    "rope_table f32 cos 64 positions <= 9220, D 128",
    "rope_table bf16 sin 600 positions <= 40960, D 128",
    "attention softmax",
    "log_probs fwd",
    "log_probs bwd",
    "vocab chunk stats bf16",
    "vocab chunk grad f32",
    "sample",
    "sample f32 3x151936",
    "sample bf16 2x151936",
    "qk_norm_rope_cache f32 q 3x16x128",
    "qk_norm_rope_cache bf16 k col 4 of 9",
    "qk_norm_rope_cache bf16 q 2x6x64 no norm",
    "qk_norm_rope_cache f32 v copied, the rest kept",
    "qk_norm_rope_paged bf16 q 3x16x128",
    "qk_norm_rope_paged f32 k to 24 of 216 pool rows, kv 8",
    "qk_norm_rope_paged bf16 v copied, the rest kept",
    "qk_norm_rope_cache bf16_fp8: the bf16 instance's q, k and v bytes, 0 wrong",
    "qk_norm_rope_paged bf16_fp8: the bf16 instance's q, k and v bytes, 0 wrong",
    "add_rms_norm f32 sum",
    "add_rms_norm bf16 norm",
    "pool_store w16 40 rows of 256 B into 97, 0 to the scratch row",
    "pool_store w16 63 rows of 128 B into 64, 5 to the scratch row",
    "pool_store w16 17 rows of 96 B into 50, 0 to the scratch row",
    "pool_store w4 29 rows of 12 B into 41, 3 to the scratch row",
    "pool_store w4 250 rows of 256 B into 300, 2 to the scratch row",
];

fn assert_ops_pass(out: &Output, how: &str) {
    let (stdout, stderr) = text(out);
    assert!(
        out.status.success() && stdout.contains("all checks ok"),
        "the emulated kernels fail their checks ({how}):\n{stdout}\n{stderr}"
    );
    for check in OPS_CHECKS {
        assert!(
            stdout.contains(check),
            "no check of `{check}` ran ({how}):\n{stdout}"
        );
    }
}

/// RMSNorm (forward, dx, the two-pass dw), SwiGLU, RoPE in its three layouts, the attention
/// softmax, the token log-probabilities, the vocabulary chunks, the decode step's fused chain
/// (q/k norms + RoPE + the cache write into a dense cache's column or a paged pool's rows, in
/// the model's dtype or as an FP8 cache's E4M3 bytes; the residual add + RMSNorm; whole rows into
/// a paged pool) and the sampler against float64 references (the
/// sampler against the CPU sampler's rule on the same draws), f32 and bf16, at shapes that hit
/// the edges (see ops_check.cu), under a fair schedule and one with a lagging warp.
#[test]
fn every_other_kernel_matches_the_float64_reference_in_the_emulator() {
    let test = "every_other_kernel_matches_the_float64_reference_in_the_emulator";
    let Some(prog) = build_emulated(test, "ops_check", false) else {
        return;
    };
    assert_ops_pass(&prog.run(&["--seeds", "2"]), "guard pages");
}

/// The same checks built with AddressSanitizer: every global and shared access of every kernel
/// (static `__shared__` arrays included) within its allocation, to the byte.
/// The pool's stores stop at an index past the pool (`pool_store_*`'s trap) rather than write
/// past it.
#[test]
fn a_pool_store_past_the_pool_stops_the_kernel() {
    let test = "a_pool_store_past_the_pool_stops_the_kernel";
    let Some(prog) = build_emulated(test, "ops_check", false) else {
        return;
    };
    assert_refused(&prog, "pool-store-past-the-pool", "a kernel trapped");
}

#[test]
fn every_other_kernel_stays_in_bounds_under_address_sanitizer() {
    let test = "every_other_kernel_stays_in_bounds_under_address_sanitizer";
    let Some(prog) = build_emulated(test, "ops_check", true) else {
        return;
    };
    assert_ops_pass(&prog.run(&[]), "AddressSanitizer");
}

/// The planted faults of `emu_faults.cu` and the words the refusal must say.
const FAULTS: [(&str, &str); 10] = [
    ("misaligned-cp-async", "misaligned cp.async of 16 bytes"),
    ("misaligned-ldmatrix", "is not 16-byte aligned"),
    ("misaligned-vector-load", "a misaligned 16-byte load"),
    ("divergent-barrier", "a divergent barrier"),
    ("exit-while-waiting", "part of a block"),
    (
        "oob-global-read",
        "out-of-bounds read 0 bytes past the end of a device allocation",
    ),
    (
        "oob-global-write",
        "out-of-bounds write 0 bytes past the end of a device allocation",
    ),
    (
        "oob-shared-read",
        "past the end of the block's dynamic shared memory",
    ),
    ("smem-without-opt-in", "raise it with cudaFuncSetAttribute"),
    ("smem-above-limit", "above the H100's 232448 per block"),
];

fn assert_refused(prog: &Emulated, mode: &str, says: &str) {
    let out = prog.run(&[mode]);
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success() && stderr.contains(says),
        "the emulator did not refuse `{mode}` saying `{says}` (status {:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
}

/// The emulator refuses what a GPU refuses, each planted fault with a message naming it (and
/// the same kernels keeping the rules run through): a misaligned cp.async, ldmatrix or 16-byte
/// load, a
/// divergent barrier, a thread leaving while others wait at a barrier, reads and writes past a
/// device allocation or the dynamic shared memory, and dynamic shared memory above the default
/// without the kernel's opt-in or above the H100's limit.
#[test]
fn the_emulator_refuses_what_a_gpu_refuses() {
    let test = "the_emulator_refuses_what_a_gpu_refuses";
    let Some(prog) = build_emulated(test, "emu_faults", false) else {
        return;
    };
    let out = prog.run(&["control"]);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success() && stdout.contains("ran to the end"),
        "the planted kernels, keeping the rules, fail:\n{stdout}\n{stderr}"
    );
    for (mode, says) in FAULTS {
        assert_refused(&prog, mode, says);
    }
}

/// Blocks that add into one buffer in their grid order (common.cuh's `block_wait_count` /
/// `block_post_count`, the deterministic dQ of issue #59): with several blocks resident and
/// interleaving, the emulator shows a block that adds without waiting, or that counts itself
/// before its other threads have added (the sum's bits are another order's), and a wait no
/// block will satisfy (a deadlock naming each resident block's wait); the rule-keeping kernel
/// gives the ordered sum's bits with 1 to 4 blocks resident under 8 schedules each.
#[test]
fn the_emulator_catches_blocks_that_add_out_of_order() {
    let test = "the_emulator_catches_blocks_that_add_out_of_order";
    let Some(prog) = build_emulated(test, "emu_faults", false) else {
        return;
    };
    let out = prog.run(&["control"]);
    assert!(
        out.status.success(),
        "the ordered adds, keeping the rules, fail:\n{}",
        text(&out).1
    );
    for (mode, says) in [
        ("unordered-add", "the blocks added out of order"),
        ("post-before-barrier", "the blocks added out of order"),
        ("wait-never-met", "waits for the flag at"),
        (
            "wait-never-met-resident",
            "deadlock: every resident block waits (3 resident",
        ),
    ] {
        assert_refused(&prog, mode, says);
    }
}

/// Built with AddressSanitizer, the emulator catches what its guard pages cannot: an overflow
/// of a static `__shared__` array; out-of-bounds device accesses are caught to the byte.
#[test]
fn under_address_sanitizer_the_emulator_catches_static_shared_overflows() {
    let test = "under_address_sanitizer_the_emulator_catches_static_shared_overflows";
    let Some(prog) = build_emulated(test, "emu_faults", true) else {
        return;
    };
    let out = prog.run(&["control"]);
    assert!(
        out.status.success(),
        "the planted kernels, keeping the rules, fail under AddressSanitizer:\n{}",
        text(&out).1
    );
    assert_refused(&prog, "static-shared-overflow", "global-buffer-overflow");
    assert_refused(&prog, "oob-global-read", "heap-buffer-overflow");
    assert_refused(&prog, "oob-shared-read", "heap-buffer-overflow");
    assert_refused(&prog, "divergent-barrier", "a divergent barrier");
}
