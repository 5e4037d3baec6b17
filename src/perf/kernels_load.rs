//! `acpo bench kernels-load`: how long a GPU's driver takes to load each of acpo's kernel
//! modules. The kernels ship as PTX for compute capability 9.0 (build.rs), which the driver
//! compiles to the GPU's code at a process's first load of each module (its JIT) and keeps in
//! its cache (`CUDA_CACHE_PATH`), so that later processes load the compiled code. The GPU suite
//! runs this first, in the background while its kernel checks run on their own binaries: the
//! JIT is paid there rather than inside the first timed section, and this report says what each
//! module's JIT costs (the case for shipping compiled code for sm_90 in the binary), or, with
//! the cache warm, what a load costs.

use std::path::{Path, PathBuf};

use super::{write_report, PerfError, Result};

/// One module's load: its file stem, PTX size and seconds.
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
        "Each kernel module of `kernels/` loaded once on the GPU (`acpo bench kernels-load`): the driver's JIT of its PTX for compute 9.0, or a load from its cache (`CUDA_CACHE_PATH`: {}). {:.1} s in all.\n\n| module | PTX | seconds |\n|---|---:|---:|\n",
        cache.as_deref().unwrap_or("the driver's default"),
        total
    );
    for l in &loads {
        md.push_str(&format!(
            "| `{}.cu` | {:.1} MB | {:.2} |\n",
            l.module,
            l.ptx_bytes as f64 / 1e6,
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
    let context = dev.cuda_stream().context().clone();
    let mut loads = Vec::new();
    for (module, ptx) in crate::fused::launch::MODULES {
        let started = std::time::Instant::now();
        context
            .load_module(Ptx::from_src(*ptx))
            .map_err(|e| PerfError::Shape(format!("bench kernels-load: {module}.cu: {e}")))?;
        let seconds = started.elapsed().as_secs_f64();
        println!("kernels-load: {module}.cu in {seconds:.2} s");
        loads.push(ModuleLoad {
            module: (*module).into(),
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
