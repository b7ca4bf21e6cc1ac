#!/usr/bin/env bash
# On a GPU machine (see benches/gpu/build.sh), from the repository root:
# the wgpu parity tests under CI=true, then engine-bench on TinyLlama-1.1B's
# and Llama-3.2-1B's shapes in bf16 (batch 1, 8, 32; 128-token prompts; 32
# decode steps) with a kernel profile, then the same shapes in Hugging Face
# transformers (eager PyTorch, bf16) on the same card, all in one call.
# Output goes to stdout and, when $OUT is set, to $OUT/gpu-bench.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
log=${OUT:-/tmp}/gpu-bench.log
exec > >(tee "$log") 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# Tests that look for ../shared/models find the repository's models there.
[ -e ../shared/models ] || { mkdir -p ../shared && ln -s "$PWD/models" ../shared/models; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== parity tests (CI=true) =="
status=0
for t in wgpu_kernels wgpu_engine wgpu_sample wgpu_gguf; do
    (cd kernels && CI=true "../.gpu/bin/$t" -q 2>&1 | grep -v XDG_RUNTIME_DIR) || status=1
done
echo "tests exit: $status"
for shape in tinyllama-1.1b llama-3.2-1b; do
    echo "== engine-bench $shape =="
    timeout 240 .gpu/bin/engine-bench --shape "$shape" --backend wgpu --dtype bf16 \
        --batch 1,8,32 --prompt 128 --steps 32 --profile 2>&1 | grep -v XDG_RUNTIME_DIR
done
echo "== transformers eager, same shapes and card =="
PYTHONUNBUFFERED=1 timeout 240 python3 benches/gpu/hf_anchor.py
