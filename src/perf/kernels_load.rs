//! `acpo bench kernels-load`: how long a GPU's driver takes to load each of acpo's kernel
//! modules, and candle's. The kernels ship as PTX for compute capability 9.0 (build.rs), which the driver
//! compiles to the GPU's code at a process's first load of each module (its JIT) and keeps in
//! its cache (`CUDA_CACHE_PATH`), so that later processes load the compiled code. The GPU suite
//! runs this first, in the background while its kernel checks run on their own binaries: the
//! JIT is paid there rather than inside the first timed section, and this report says what each
//! module's JIT costs (the case for shipping compiled code for sm_90 in the binary), or, with
//! the cache warm, what a load costs.

use std::path::{Path, PathBuf};

use super::{write_report, PerfError, Result};

/// One module's load: its name (`kernels/NAME.cu`, `candle-kernels NAME`), PTX size and seconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModuleLoad {
    pub module: String,
    pub ptx_bytes: usize,
    pub seconds: f64,
}

/// Loads every kernel module on `device` (CUDA), timing each, and writes `kernels-load.json`
/// and `kernels-load.md` under `out`; returns the Markdown report. On any other device, an
/// error: there is nothing to load.
pub fn kernels_load(device: &candle_core::Device, out: &Path) -> Result<PathBuf> {
    let loads = load_all(device)?;
    let total: f64 = loads.iter().map(|l| l.seconds).sum();
    let cache = std::env::var("CUDA_CACHE_PATH").ok();
    let report = serde_json::json!({
        "modules": loads, "total_seconds": total, "cuda_cache_path": cache,
        "cuda_cache_disable": std::env::var("CUDA_CACHE_DISABLE").ok(),
    });
    write_report(out, "kernels-load.json", format!("{report:#}").as_bytes())?;
    let mut md = format!(
        "Each kernel module of `kernels/`, and of candle's kernels that acpo's ops reach, loaded once on the GPU (`acpo bench kernels-load`): the driver's JIT of its PTX for compute 9.0, or a load from its cache (`CUDA_CACHE_PATH`: {}). {:.1} s in all.\n\n| module | PTX | seconds |\n|---|---:|---:|\n",
        cache.as_deref().unwrap_or("the driver's default"),
        total
    );
    for l in &loads {
        md.push_str(&format!(
            "| `{}` | {:.0} KB | {:.2} |\n",
            l.module,
            l.ptx_bytes as f64 / 1e3,
            l.seconds
        ));
    }
    write_report(out, "kernels-load.md", md.as_bytes())
}

#[cfg(feature = "cuda")]
fn load_all(device: &candle_core::Device) -> Result<Vec<ModuleLoad>> {
    use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
    let candle_core::Device::Cuda(dev) = device else {
        return Err(PerfError::NeedsCuda("kernels-load"));
    };
    use candle_core::cuda_backend::kernels as candle;
    let context = dev.cuda_stream().context().clone();
    // acpo's modules, then those of candle's kernels acpo's ops reach (not conv, not quantized):
    // candle loads them from the same PTX text (`get_or_load_func`), so they hit the same cache
    let ours = crate::fused::launch::MODULES
        .iter()
        .map(|(stem, ptx)| (format!("kernels/{stem}.cu"), *ptx));
    let theirs = [
        ("affine", candle::AFFINE),
        ("binary", candle::BINARY),
        ("cast", candle::CAST),
        ("fill", candle::FILL),
        ("indexing", candle::INDEXING),
        ("reduce", candle::REDUCE),
        ("sort", candle::SORT),
        ("ternary", candle::TERNARY),
        ("unary", candle::UNARY),
    ]
    .map(|(name, m)| (format!("candle-kernels {name}"), m.ptx()));
    let mut loads = Vec::new();
    for (module, ptx) in ours.chain(theirs) {
        let started = std::time::Instant::now();
        context
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| PerfError::Driver(format!("bench kernels-load: {module}: {e}")))?;
        let seconds = started.elapsed().as_secs_f64();
        println!("kernels-load: {module} in {seconds:.2} s");
        loads.push(ModuleLoad {
            module,
            ptx_bytes: ptx.len(),
            seconds,
        });
    }
    Ok(loads)
}

#[cfg(not(feature = "cuda"))]
fn load_all(_: &candle_core::Device) -> Result<Vec<ModuleLoad>> {
    Err(PerfError::NeedsCuda("kernels-load"))
}
