//! FP8 E4M3 bytes, as an FP8 KV cache holds them on a GPU (issue #57, `kernels/fp8.cu`): a key
//! or value rounded to its byte as it is cached, and the bytes back to f32 or bf16 (exact) for
//! what reads the cache other than the decode kernel. Stored as `DType::U8`: candle 0.11 has a
//! `F8E4M3` dtype, but its CUDA backend looks its kernels up under names the kernels do not have
//! (`cast_bf16_f8e4m3` for `cast_bf16_f8_e4m3`, candle issue #3886), so no cast, strided copy
//! or index_select of that dtype runs on a GPU; bytes are bytes to every op a cache needs.
//!
//! The rounding is to nearest, ties to even, saturating at ±448, NaN to 0x7f: what
//! `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)` and candle's CPU cast (after the clamp
//! [`crate::model::qwen::fp8_e4m3`] applies) give; these functions are the kernels' CPU twin,
//! and tests/it/fused.rs holds them to candle's CPU cast on every bf16 number.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

/// E4M3's largest finite magnitude.
const MAX: f32 = 448.0;

/// `x` rounded to its E4M3 byte (`kernels/fp8.cuh`'s `fp8_e4m3_byte`, the same arithmetic).
pub fn fp8_byte(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= MAX {
        return sign | 0x7e;
    }
    if a < 0.015625 {
        // subnormal: m·2⁻⁹, m = 0..8 (8 is 2⁻⁶'s code); a·512 is exact
        return sign | round_even(a * 512.0) as u8;
    }
    // a = (1 + q/8)·2^e, q from the mantissa; the exponent field e + 7 (1..15)
    let e = a.log2().floor() as i32;
    let e = if 2f32.powi(e) > a {
        e - 1
    } else if 2f32.powi(e + 1) <= a {
        e + 1
    } else {
        e
    };
    let (mut q, mut biased) = (
        round_even((a / 2f32.powi(e) - 1.0) * 8.0) as u32,
        (e + 7) as u32,
    );
    if q == 8 {
        q = 0;
        biased += 1;
    }
    sign | ((biased << 3) | q).min(0x7e) as u8
}

/// To the nearest integer, ties to even (C's `rintf` in the default rounding mode).
fn round_even(x: f32) -> f32 {
    let r = x.round();
    if (r - x).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

/// An E4M3 byte's value, exactly (`kernels/fp8.cuh`'s `fp8_e4m3_value`).
pub fn fp8_value(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((b >> 3) & 0xf), f32::from(b & 7));
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    if e == 0 {
        return sign * m * 2f32.powi(-9);
    }
    sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
}

/// E4M3 bytes' values, exactly ([`fp8_value`] each): what the CPU reads of an FP8 cache.
pub(in crate::fused) fn fp8_values(bytes: &[u8]) -> Vec<f32> {
    bytes.iter().map(|&b| fp8_value(b)).collect()
}

/// `x` (f32 or bf16, any shape) rounded to E4M3 bytes, `DType::U8` of its shape.
pub fn to_fp8_bytes(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&ToFp8)
}

/// E4M3 bytes `b` (`DType::U8`) as their values in `dtype` (f32 or bf16; exact).
pub fn from_fp8_bytes(b: &Tensor, dtype: DType) -> Result<Tensor> {
    if b.dtype() != DType::U8 || !matches!(dtype, DType::F32 | DType::BF16) {
        candle_core::bail!(
            "fp8: E4M3 bytes are u8 (got {:?}) read as f32 or bf16 (asked {dtype:?})",
            b.dtype()
        );
    }
    // the CPU twin gives f32, which holds every E4M3 value and casts to bf16 exactly
    let values = b.contiguous()?.apply_op1_no_bwd(&FromFp8(dtype))?;
    if values.dtype() == dtype {
        Ok(values)
    } else {
        values.to_dtype(dtype)
    }
}

struct ToFp8;

impl CustomOp1 for ToFp8 {
    fn name(&self) -> &'static str {
        "acpo-to-fp8"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("{}: input must be contiguous", self.name());
        };
        let out: Vec<u8> = match s {
            CpuStorage::F32(x) => x[a..b].iter().map(|&v| fp8_byte(v)).collect(),
            CpuStorage::BF16(x) => x[a..b].iter().map(|v| fp8_byte(v.to_f32())).collect(),
            _ => candle_core::bail!("{}: f32 or bf16 numbers expected", self.name()),
        };
        Ok((CpuStorage::U8(out), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::to_fp8(s, l)
    }
}

/// Bytes to values: in the dtype asked on CUDA, f32 on the CPU (the caller casts).
struct FromFp8(#[cfg_attr(not(feature = "cuda"), allow(dead_code))] DType);

impl CustomOp1 for FromFp8 {
    fn name(&self) -> &'static str {
        "acpo-from-fp8"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (Some((a, b)), CpuStorage::U8(x)) = (l.contiguous_offsets(), s) else {
            candle_core::bail!("{}: contiguous u8 bytes expected", self.name());
        };
        Ok((CpuStorage::F32(fp8_values(&x[a..b])), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::from_fp8(s, l, self.0)
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};

    use crate::fused::launch::{dtype_of, elems_config, kernel, ptx, suffix, view, with_type};

    const PTX: (&str, &str) = ptx!("fp8");

    pub fn to_fp8(x: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-to-fp8";
        let sfx = suffix(dtype_of(x), what)?;
        with_type!(dtype_of(x), T, {
            let out =
                per_number::<T, u8>(x, &view::<T>(x, l, what)?, &format!("fp8_e4m3_from_{sfx}"))?;
            Ok((out, l.shape().clone()))
        })
    }

    pub fn from_fp8(x: &CudaStorage, l: &Layout, dtype: DType) -> Result<(CudaStorage, Shape)> {
        let what = "acpo-from-fp8";
        let sfx = suffix(dtype, what)?;
        let xv = view::<u8>(x, l, what)?;
        with_type!(dtype, T, {
            let out = per_number::<u8, T>(x, &xv, &format!("fp8_e4m3_to_{sfx}"))?;
            Ok((out, l.shape().clone()))
        })
    }

    /// Kernel `name` of kernels/fp8.cu over the numbers of `xv` (a view of `x`), one thread a
    /// number: `(const I* x, O* out, size_t len)`, every output written.
    fn per_number<I: DeviceRepr, O: CudaDType + DeviceRepr>(
        x: &CudaStorage,
        xv: &CudaView<I>,
        name: &str,
    ) -> Result<CudaStorage> {
        let dev = &x.device;
        let len = xv.len();
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<O>(len.max(1)) }?;
        if len > 0 {
            let f = kernel!(dev, name, PTX)?;
            let mut b = f.builder();
            b.arg(xv).arg(&mut out).arg(&len);
            // SAFETY: the arguments match fp8_e4m3_{from,to}_* in kernels/fp8.cu.
            unsafe { b.launch(elems_config(len)) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}
