// The launch numbers of kernels/launch.cuh as PTX globals, for the host: build.rs compiles this
// file with the kernels and writes each `acpo_size_NAME` global it finds in the PTX as the Rust
// constant `NAME` (src/fused/launch.rs, `sizes`). nvcc evaluates the expressions, so a size is
// computed in one place only. No kernel here.
#include "flash.cuh"

#define ACPO_SIZE(NAME, VALUE) extern "C" __device__ const unsigned acpo_size_##NAME = (VALUE);

ACPO_SIZE(ROW_THREADS, ROW_THREADS)
ACPO_SIZE(ELEM_THREADS, ELEM_THREADS)
ACPO_SIZE(RMS_DW_COLS, RMS_DW_COLS)
ACPO_SIZE(RMS_DW_GROUPS, RMS_DW_GROUPS)
ACPO_SIZE(RMS_DW_ROWS, RMS_DW_ROWS)
ACPO_SIZE(ADAMW_CHUNK, ADAMW_CHUNK)
ACPO_SIZE(ADAMW_THREADS, ADAMW_THREADS)
ACPO_SIZE(FA_WARPS, FA_WARPS)
ACPO_SIZE(FD_SPLIT, FD_SPLIT)
ACPO_SIZE(FD_WARPS, FD_WARPS)
ACPO_SIZE(FD_MAXG, FD_MAXG)
ACPO_SIZE(FA_MAXD, FA_MAXD)
ACPO_SIZE(FDP_THREADS, FDP_THREADS)
ACPO_SIZE(FDP_CHUNK, FDP_CHUNK)
ACPO_SIZE(FDP_MAXG, FDP_MAXG)
ACPO_SIZE(FDP_FILL_BLOCKS, FDP_FILL_BLOCKS)
ACPO_SIZE(FDP_SMEM_D64_BF16, fdp_smem(64, 2))
ACPO_SIZE(FDP_SMEM_D128_BF16, fdp_smem(128, 2))
ACPO_SIZE(FDP_SMEM_D64_F32, fdp_smem(64, 4))
ACPO_SIZE(FDP_SMEM_D128_F32, fdp_smem(128, 4))
ACPO_SIZE(FM_SMEM_FWD_D64, fm_smem_fwd(64))
ACPO_SIZE(FM_SMEM_FWD_D128, fm_smem_fwd(128))
ACPO_SIZE(FM_FWD_ROWS_D64, fm_fwd_rows(64))
ACPO_SIZE(FM_FWD_ROWS_D128, fm_fwd_rows(128))
ACPO_SIZE(FM_FWD_THREADS_D64, fm_fwd_threads(64))
ACPO_SIZE(FM_FWD_THREADS_D128, fm_fwd_threads(128))
ACPO_SIZE(FM_DKDV_ROWS_D64, fm_dkdv_rows(64))
ACPO_SIZE(FM_DKDV_ROWS_D128, fm_dkdv_rows(128))
ACPO_SIZE(FM_DKDV_THREADS_D64, fm_dkdv_threads(64))
ACPO_SIZE(FM_DKDV_THREADS_D128, fm_dkdv_threads(128))
ACPO_SIZE(FM_SMEM_DQ_D64, fm_smem_dq(64))
ACPO_SIZE(FM_SMEM_DQ_D128, fm_smem_dq(128))
ACPO_SIZE(FM_SMEM_DKDV_D64, fm_smem_dkdv(64))
ACPO_SIZE(FM_SMEM_DKDV_D128, fm_smem_dkdv(128))
ACPO_SIZE(SMEM_DEFAULT_LIMIT, SMEM_DEFAULT_LIMIT)
ACPO_SIZE(SMEM_OPT_IN_LIMIT, SMEM_OPT_IN_LIMIT)
