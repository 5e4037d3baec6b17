//! Records the git commit and the versions of the crates that decide the numbers, for each
//! run's provenance.json (a binary built outside a git checkout says "unknown").

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dirty = std::process::Command::new("git")
        // --no-optional-locks: a plain `git status` refreshes .git/index, which this script
        // watches, so the next cargo command compiled the crate once more (71 s in release).
        .args([
            "--no-optional-locks",
            "status",
            "--porcelain",
            "--untracked-files=no",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    println!(
        "cargo:rustc-env=ACPO_GIT_COMMIT={commit}{}",
        if dirty { "-dirty" } else { "" }
    );
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut versions = Vec::new();
    for name in [
        "candle-core",
        "candle-nn",
        "tokenizers",
        "polars",
        "hf-hub",
        "plotters",
    ] {
        let needle = format!("name = \"{name}\"\nversion = \"");
        if let Some(i) = lock.find(&needle) {
            let rest = &lock[i + needle.len()..];
            versions.push(format!("{name}={}", rest.split('"').next().unwrap_or("?")));
        }
    }
    println!("cargo:rustc-env=ACPO_CRATE_VERSIONS={}", versions.join(","));
    println!("cargo:rerun-if-changed=Cargo.lock");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        compile_kernels();
    }
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
}

/// Compiles every `kernels/*.cu` to PTX in OUT_DIR (the `cuda` feature; docs/CUDA.md): PTX for
/// compute capability 9.0, which the driver of a Hopper GPU compiles at load. nvcc is `$NVCC`,
/// else `$CUDA_ROOT/bin/nvcc`, else the one on PATH (`tools/gpu/cuda-toolkit.sh` sets these up).
fn compile_kernels() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var_os("NVCC")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("CUDA_ROOT")
                .map(|r| std::path::Path::new(&r).join("bin/nvcc"))
                .filter(|p| p.exists())
        })
        .unwrap_or_else(|| "nvcc".into());
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    let mut sources: Vec<_> = std::fs::read_dir("kernels")
        .expect("kernels/ is in the repository")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cu" || e == "cuh"))
        .collect();
    sources.sort();
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        if src.extension().is_some_and(|e| e == "cuh") {
            continue;
        }
        let stem = src.file_stem().expect("a file name").to_string_lossy();
        let ptx = out.join(format!("{stem}.ptx"));
        let status = std::process::Command::new(&nvcc)
            .args(["-ptx", "-O3", "-std=c++17", "-arch=compute_90", "-Ikernels", "-o"])
            .arg(&ptx)
            .arg(src)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} to compile {}: {e} (eval \"$(tools/gpu/cuda-toolkit.sh)\" first, docs/CUDA.md)",
                    nvcc.display(),
                    src.display()
                )
            });
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
    write_modules(&out, &sources);
    write_sizes(&out);
}

/// `kernel_modules.rs`: every kernel file's stem and PTX (`fused::launch::MODULES`, what `acpo
/// bench kernels-load` loads), `sizes.cu` left out (no kernel: build.rs reads its numbers).
fn write_modules(out: &std::path::Path, sources: &[std::path::PathBuf]) {
    let mut list = String::from("&[\n");
    for src in sources {
        let stem = src.file_stem().expect("a file name").to_string_lossy();
        if src.extension().is_some_and(|e| e == "cu") && stem != "sizes" {
            list.push_str(&format!(
                "    (\"{stem}\", include_str!(concat!(env!(\"OUT_DIR\"), \"/{stem}.ptx\"))),\n"
            ));
        }
    }
    list.push(']');
    std::fs::write(out.join("kernel_modules.rs"), list).expect("OUT_DIR is writable");
}

/// The launch numbers of `kernels/launch.cuh`, as nvcc evaluated them into `sizes.ptx`
/// (`kernels/sizes.cu`: one `.global .u32 acpo_size_NAME = VALUE;` each), written as Rust
/// constants to `OUT_DIR/kernel_sizes.rs` for `src/fused/launch.rs`: the host and the kernels
/// read one definition.
fn write_sizes(out: &std::path::Path) {
    let ptx = std::fs::read_to_string(out.join("sizes.ptx")).expect("nvcc wrote sizes.ptx");
    let mut rust =
        String::from("// Generated by build.rs from kernels/sizes.cu (kernels/launch.cuh).\n");
    for line in ptx.lines() {
        let Some(rest) = line.split("acpo_size_").nth(1) else {
            continue;
        };
        let (name, value) = rest
            .split_once('=')
            .unwrap_or_else(|| panic!("sizes.ptx: `{line}` has no value"));
        let value: u32 = value
            .trim()
            .trim_end_matches(';')
            .parse()
            .unwrap_or_else(|e| panic!("sizes.ptx: `{line}`: {e}"));
        rust.push_str(&format!("pub const {}: u32 = {value};\n", name.trim()));
    }
    std::fs::write(out.join("kernel_sizes.rs"), rust).expect("write kernel_sizes.rs");
}
