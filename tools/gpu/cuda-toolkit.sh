#!/usr/bin/env bash
# Sets up the pinned CUDA 13.0 toolkit from NVIDIA's PyPI wheels, on a machine with or without a
# GPU, and prints the environment a `--features cuda` build needs (docs/CUDA.md).
#
#   eval "$(tools/gpu/cuda-toolkit.sh [DIR])"      # DIR defaults to ~/.cache/acpo/cuda-13.0
#
# Why these pins: the GPU machines' driver (580, CUDA 13.0) cannot JIT PTX newer than nvcc 13.0
# emits (13.5 writes PTX 9.5), and candle-core's `cuda` feature links libcuda, libcudart,
# libcublas and libcurand dynamically, so they must exist at link time; without a GPU driver a
# stub libcuda (every CUresult function returns an error) satisfies the linker. The binary then
# needs the real libraries at start-up: on the GPU machine, the driver's libcuda and the wheels'
# lib directory on LD_LIBRARY_PATH.
set -euo pipefail

dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/acpo/cuda-13.0}"
venv="$dir/venv"
root="$dir/root"
wheels=(
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
)

if [ ! -x "$root/bin/nvcc" ]; then
  mkdir -p "$dir"
  {
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${wheels[@]}"
  } >&2
  nv=$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)
  [ -x "$nv/bin/nvcc" ] || { echo "cuda-toolkit.sh: no nvcc in $nv" >&2; exit 2; }
  mkdir -p "$root/lib64/stubs"
  ln -sfn "$nv/bin" "$root/bin"
  ln -sfn "$nv/include" "$root/include"
  ln -sfn "$nv/nvvm" "$root/nvvm"
  for f in "$nv"/lib/lib*.so.*; do
    b=$(basename "$f")
    ln -sf "$f" "$root/lib64/$b"
    ln -sf "$b" "$root/lib64/${b%%.so*}.so"
  done
  # The stub libcuda: every `CUresult cuXxx(` of cuda.h, returning CUDA_ERROR_UNKNOWN (999).
  echo '#include <cuda.h>' | gcc -E -I"$nv/include" -x c - | tr '\n' ' ' \
    | grep -oE 'CUresult +cu[A-Za-z0-9_]+ *\(' | grep -oE 'cu[A-Za-z0-9_]+' | sort -u \
    | awk '{print "int "$1"(void){return 999;}"}' > "$root/lib64/stubs/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$root/lib64/stubs/libcuda.so.1" \
    "$root/lib64/stubs/stub.c"
  ln -sf libcuda.so.1 "$root/lib64/stubs/libcuda.so"
fi

cat <<ENV
export CUDA_ROOT="$root" CUDA_HOME="$root" CUDA_PATH="$root"
export PATH="$root/bin:\$PATH"
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-90}"
export NVCC_CCBIN="\${NVCC_CCBIN:-/usr/bin/g++}"
export LIBRARY_PATH="$root/lib64:$root/lib64/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
ENV
