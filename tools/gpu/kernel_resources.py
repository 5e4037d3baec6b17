#!/usr/bin/env python3
"""Registers, spills and shared memory of every kernel for sm_90, without a GPU.

Compiles each kernels/*.cu to PTX exactly as build.rs does (nvcc -ptx -O3 -std=c++17
-arch=compute_90 -Ikernels), runs `ptxas -arch=sm_90 -v` on that PTX (what the driver does at
load), and writes OUT_DIR/kernel-resources.md: a table of each kernel's registers per thread,
stack frame, spill stores and loads, static shared memory, the dynamic shared memory its launch
gives it (kernels/launch.cuh, as nvcc evaluated it in kernels/sizes.cu) and barriers. docs/CUDA.md
quotes the file in its `kernel-resources.md` block (`acpo doc docs/CUDA.md --from OUT_DIR`; CI
runs `acpo doc --check` on it, so the table cannot go stale).

    eval "$(tools/gpu/cuda-toolkit.sh)"
    python3 tools/gpu/kernel_resources.py OUT_DIR

Exit status 1 when any kernel spills (after writing the table: CI fails on a spill), 2 on a
usage or toolchain error. nvcc is $NVCC, else $CUDA_ROOT/bin/nvcc, else the one on PATH;
ptxas sits beside it.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(ROOT, "kernels")


def die(msg):
    print(f"kernel_resources: {msg}", file=sys.stderr)
    sys.exit(2)


def nvcc_path():
    if os.environ.get("NVCC"):
        return os.environ["NVCC"]
    root = os.environ.get("CUDA_ROOT")
    if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
        return os.path.join(root, "bin", "nvcc")
    found = shutil.which("nvcc")
    if not found:
        die('no nvcc: eval "$(tools/gpu/cuda-toolkit.sh)" first (docs/CUDA.md)')
    return found


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return p.stderr


def ptx_of(nvcc, src, out):
    run([nvcc, "-ptx", "-O3", "-std=c++17", "-arch=compute_90", "-I" + KERNELS, "-o", out, src])


FUNC = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def resources(ptxas, ptx):
    """{kernel: dict} from ptxas -v on one PTX file."""
    text = run([ptxas, "-arch=sm_90", "-v", ptx, "-o", os.devnull])
    out, name = {}, None
    for line in text.splitlines():
        if m := FUNC.search(line):
            name = m.group(1)
            out.setdefault(name, {})
        elif (m := FRAME.search(line)) and name:
            out[name].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        elif (m := USED.search(line)) and name:
            out[name].update(
                regs=int(m.group(1)), barriers=int(m.group(2) or 0), smem=int(m.group(3) or 0)
            )
    for k, v in out.items():
        if "regs" not in v or "stack" not in v:
            die(f"ptxas -v said too little about {k} in {ptx}")
    return out


def sizes(ptx):
    """The acpo_size_NAME globals of sizes.ptx (kernels/launch.cuh's numbers)."""
    got = {}
    for line in open(ptx):
        if m := re.search(r"acpo_size_(\w+) = (\d+);", line):
            got[m.group(1)] = int(m.group(2))
    return got


# The sampler's dynamic shared memory grows with the vocabulary: the table gives Qwen3's.
QWEN3_VOCAB = 151_936


def dynamic_smem(kernel, size):
    """The dynamic shared memory the host launches `kernel` with (0 for the others)."""
    if re.match(r"sample_(full|trunc)_(f32|bf16)$", kernel):  # launch.cuh's sample_smem(v): a double per group
        return -(-QWEN3_VOCAB // size["SAMPLE_GROUP"]) * 8
    # the pipelined decode and its paged instance: the same ring of tiles
    m = re.match(r"flash_decode_(?:pipe|paged)_d(\d+)_(bf16|f32|fp8)(?:_g\d+)?$", kernel)
    if m:
        return size[f"FDP_SMEM_D{m.group(1)}_{m.group(2).upper()}"]
    m = re.match(r"flash_(fwd|dq|dkdvq|dkdv)_mma_d(\d+)_bf16$", kernel)
    if not m:
        return 0
    which = m.group(1).upper()
    return size[f"FM_SMEM_{which}_D{m.group(2)}"]


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    nvcc = nvcc_path()
    ptxas = os.path.join(os.path.dirname(nvcc), "ptxas")
    if not os.path.exists(ptxas):
        die(f"no ptxas beside {nvcc}")
    sources = sorted(f for f in os.listdir(KERNELS) if f.endswith(".cu"))
    rows, spills = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "sizes.ptx")
        ptx_of(nvcc, os.path.join(KERNELS, "sizes.cu"), ptx)
        size = sizes(ptx)
        for src in sources:
            if src == "sizes.cu":
                continue
            ptx = os.path.join(tmp, src[:-3] + ".ptx")
            ptx_of(nvcc, os.path.join(KERNELS, src), ptx)
            for kernel, r in sorted(resources(ptxas, ptx).items()):
                dyn = dynamic_smem(kernel, size)
                rows.append((src, kernel, r, dyn))
                if r["spill_st"] or r["spill_ld"]:
                    spills.append(kernel)
    lines = [
        "| file | kernel | registers | stack frame B | spill stores B | spill loads B "
        "| static shared B | dynamic shared B | barriers |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for src, kernel, r, dyn in rows:
        lines.append(
            f"| `{src}` | `{kernel}` | {r['regs']} | {r['stack']} | {r['spill_st']} "
            f"| {r['spill_ld']} | {r['smem']:,} | {dyn:,} | {r['barriers']} |"
        )
    lines.append("")
    lines.append(
        f"{len(rows)} kernels, ptxas of CUDA 13.0 for sm_90 on the PTX build.rs makes "
        f"(`python3 tools/gpu/kernel_resources.py`); the sampler's dynamic shared memory at "
        f"Qwen3's vocabulary of {QWEN3_VOCAB:,}; "
        + (f"spilling: {', '.join(spills)}." if spills else "none spills.")
    )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "kernel-resources.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.join(out_dir, 'kernel-resources.md')} ({len(rows)} kernels)")
    if spills:
        print(f"kernel_resources: {len(spills)} kernels spill: {', '.join(spills)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
