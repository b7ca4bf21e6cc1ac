#!/usr/bin/env bash
# On a GPU machine (see benches/gpu/build.sh), from the repository root:
#   tests           the wgpu parity tests (CI=true: a missing adapter fails)
#   bench:SHAPE     engine-bench on SHAPE (tinyllama-1.1b, llama-3.2-1b) in
#                   bf16, batch 1, 8 and 32, 128-token prompts, 32 decode
#                   steps, with the kernel profile
#   ab:SHAPE        the kernel choices made without a GPU, each against its
#                   alternative on SHAPE (no profile): batch 32 on the wide
#                   mat-vec (default) vs the tiled matmul past 8 rows
#                   (--mat-vec-rows 8), and batch 1 and 8 with SiLU and the
#                   norms fused into the mat-vecs and subgroup reductions
#                   (default) vs each without (--no-fused-glu,
#                   --no-fused-norm, --no-subgroups)
#   anchor          Hugging Face transformers (eager PyTorch, bf16) on both
#                   shapes, on the same card
# With no arguments: all of them, which can take longer than the device
# tool's 10 minutes per command; then split them over two calls, e.g.
# `run.sh tests bench:tinyllama-1.1b` and `run.sh bench:llama-3.2-1b anchor`.
# Output goes to stdout and, when $OUT is set, to $OUT/gpu-bench.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
log=${OUT:-/tmp}/gpu-bench.log
exec > >(tee -a "$log") 2>&1
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests bench:tinyllama-1.1b bench:llama-3.2-1b anchor)
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# The test binaries look for fixtures and models under the checkout they
# were built in; point that path at this copy.
root=$(cat .gpu/root)
if [ ! -e "$root" ]; then
    mkdir -p "$(dirname "$root")"
    ln -s "$PWD" "$root"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
quiet() { grep -v XDG_RUNTIME_DIR; }
for part in "${parts[@]}"; do
    case $part in
    tests)
        echo "== parity tests =="
        status=0
        for t in wgpu_kernels wgpu_engine wgpu_sample; do
            CI=true timeout 150 ".gpu/bin/$t" -q 2>&1 | quiet || status=1
        done
        # The SmolLM2 file is too big to carry (98 MB): without CI=true its
        # tests skip with their reason instead of failing.
        timeout 60 .gpu/bin/wgpu_gguf -q 2>&1 | quiet || status=1
        echo "tests exit: $status"
        ;;
    bench:*)
        shape=${part#bench:}
        echo "== engine-bench $shape =="
        timeout 280 .gpu/bin/engine-bench --shape "$shape" --backend wgpu --dtype bf16 \
            --batch 1,8,32 --prompt 128 --steps 32 --profile 2>&1 | quiet
        ;;
    ab:*)
        shape=${part#ab:}
        run() {
            echo "-- $*"
            timeout 120 .gpu/bin/engine-bench --shape "$shape" --backend wgpu --dtype bf16 \
                --prompt 128 --steps 32 "$@" 2>&1 | quiet
        }
        echo "== kernel choices on $shape =="
        run --batch 32
        run --batch 32 --mat-vec-rows 8
        run --batch 1,8
        run --batch 1,8 --no-fused-glu
        run --batch 1,8 --no-fused-norm
        run --batch 1,8 --no-subgroups
        ;;
    anchor)
        echo "== transformers eager, same shapes and card =="
        PYTHONUNBUFFERED=1 timeout 280 python3 benches/gpu/hf_anchor.py
        ;;
    *)
        echo "unknown part $part (tests, bench:SHAPE, ab:SHAPE, anchor)"
        exit 2
        ;;
    esac
done
