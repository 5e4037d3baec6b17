//! The CUDA kernels checked without a GPU: `kernels/check/*.cu` built for the CPU emulator
//! (`kernels/check/cuda_emu.hpp`, `-DACPO_EMU`) and run, so that a kernel's tensor-core layouts,
//! its pipeline and its masking are checked against a float64 reference on every machine, not
//! only on the GPU sessions some tasks are lent (tests/it/cuda.rs runs there).

use std::path::Path;
use std::process::Command;

/// Builds `kernels/check/<name>.cu` for the emulator with the system's C++ compiler and runs
/// it with `args`; None (after saying why) where no C++ compiler is found.
pub(super) fn run_emulated(test: &str, name: &str, args: &[&str]) -> Option<std::process::Output> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let dir = tempfile::tempdir().expect("a temp dir");
    let exe = dir.path().join(name);
    let built = Command::new(&cxx)
        .args(["-O2", "-std=c++17", "-DACPO_EMU", "-x", "c++"])
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
    Some(Command::new(&exe).args(args).output().expect("run"))
}

/// Every flash attention kernel against the float64 reference in the emulator: the tensor-core
/// forward, dQ and dK/dV under four schedules (a fair one, one warp lagging behind the others,
/// cp.async copies landing late or as soon as issued: a missing barrier or wait fails one of
/// them), the row kernels' forward and backward, and the split-K decode.
#[test]
fn flash_kernels_match_the_float64_reference_in_the_emulator() {
    let Some(out) = run_emulated(
        "flash_kernels_match_the_float64_reference_in_the_emulator",
        "flash_check",
        &["--seeds", "4"],
    ) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("all checks ok"),
        "the emulated flash kernels fail their checks:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for kernel in ["mma fwd", "mma bwd", "row fwd", "row bwd", "decode"] {
        assert!(text.contains(kernel), "no check of `{kernel}` ran:\n{text}");
    }
}
