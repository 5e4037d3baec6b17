//! What every CUDA launch of `kernels/*.cu` shares (the `cuda` feature): the PTX of a kernel
//! file, loading a kernel from it, device views of candle's storage, and the launch shapes of
//! the row and element-wise kernels. Each op's own launch lives beside the op, in a `cuda`
//! module of its file (`rms_norm.rs`, `flash/cuda.rs`, …): one `.cu`, one op file, one test in
//! `tests/it/cuda.rs`.
//!
//! Row kernels run one block of [`ROW_THREADS`] threads per row and reduce in a fixed order, so
//! a result is the same on every run; element-wise kernels use a grid-stride loop.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaView, LaunchConfig};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result};

/// The PTX of `kernels/<stem>.cu` (compiled by `build.rs`) and the module name it is loaded
/// under, `acpo_<stem>`.
macro_rules! ptx {
    ($stem:literal) => {
        (
            concat!("acpo_", $stem),
            include_str!(concat!(env!("OUT_DIR"), "/", $stem, ".ptx")),
        )
    };
}
pub(crate) use ptx;

/// Every kernel file's stem and PTX (build.rs: `kernels/*.cu` but `sizes.cu`), for loading them
/// all at once (`acpo bench kernels-load`); an op loads its own module through [`ptx!`].
pub const MODULES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/kernel_modules.rs"));

/// Kernel `name` of a [`ptx!`] module, loaded on `dev` at its first use. (A macro: candle does
/// not export the type of the function it returns.)
macro_rules! kernel {
    ($dev:expr, $name:expr, $module:expr) => {
        $dev.get_or_load_custom_func($name, $module.0, $module.1)
    };
}
pub(crate) use kernel;

/// Runs `$body` with `$t` bound to the Rust element type of `$dtype` (f32 or bf16).
macro_rules! with_type {
    ($dtype:expr, $t:ident, $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            other => candle_core::bail!("no CUDA kernel for {other:?} (f32 and bf16 only)"),
        }
    };
}
pub(crate) use with_type;

/// The launch numbers the kernels were compiled with (`kernels/launch.cuh`, read by build.rs
/// from nvcc's output): block shapes, tiles and dynamic shared memory, one definition for the
/// host and the device.
pub mod sizes {
    include!(concat!(env!("OUT_DIR"), "/kernel_sizes.rs"));
}

/// Threads per block of the row kernels (a multiple of 32, as `block_sum` needs).
pub const ROW_THREADS: u32 = sizes::ROW_THREADS;
/// Threads per block, and the most blocks, of the element-wise kernels.
pub const ELEM_THREADS: u32 = sizes::ELEM_THREADS;
const ELEM_MAX_BLOCKS: usize = 1 << 16;
/// The most blocks of a grid's y and z dimensions.
pub const MAX_GRID_Y: usize = 65_535;

/// One block per row; callers launch only when there is a row (a block reads its row).
pub fn rows_config(rows: usize) -> Result<LaunchConfig> {
    let rows = u32::try_from(rows)
        .map_err(|_| candle_core::Error::Msg(format!("{rows} rows are more than one launch")))?;
    Ok(LaunchConfig {
        grid_dim: (rows.max(1), 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

pub fn elems_config(len: usize) -> LaunchConfig {
    let blocks = len
        .div_ceil(ELEM_THREADS as usize)
        .clamp(1, ELEM_MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (ELEM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Lets kernel `f` of op `what` launch with `smem` bytes of dynamic shared memory: above the
/// default a kernel gets, asked for (CUDA's opt-in); above a block's most, an error naming it.
pub fn allow_smem(f: &CudaFunction, smem: u32, what: &str) -> Result<()> {
    if smem > sizes::SMEM_OPT_IN_LIMIT {
        candle_core::bail!(
            "{what}: {smem} bytes of dynamic shared memory, above the {} a block may have",
            sizes::SMEM_OPT_IN_LIMIT
        );
    }
    if smem > sizes::SMEM_DEFAULT_LIMIT {
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .w()?;
    }
    Ok(())
}

/// A grid dimension, or an error naming what would not fit in one launch.
pub fn grid_dim(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n.max(1)).map_err(|_| {
        candle_core::Error::Msg(format!("{what}: {n} blocks are more than one launch"))
    })
}

/// The contiguous elements of `s` under `l` as `T`.
pub fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let slice = s.as_cuda_slice::<T>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(slice.slice(a..b)),
        None => candle_core::bail!("{what}: input must be contiguous"),
    }
}

/// The kernel-name suffix of a storage dtype, or an error naming the op.
pub fn suffix(dtype: DType, what: &str) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => candle_core::bail!("{what}: no CUDA kernel for {other:?} (f32 and bf16 only)"),
    }
}

pub fn dtype_of(s: &CudaStorage) -> DType {
    use candle_core::backend::BackendStorage;
    s.dtype()
}
