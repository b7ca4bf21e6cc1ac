#!/usr/bin/env bash
# Builds, on this machine, everything benches/gpu/run.sh needs on a GPU
# machine that has no Rust toolchain and no network:
#   .gpu/bin/   engine-bench and the wgpu test binaries (release, stripped);
#               with BASE=<revision>, also that revision's engine-bench as
#               engine-bench-base, for run.sh's before/after parts
#   .gl/        the Vulkan loader and the glvnd libraries the NVIDIA driver
#               loads (with the loader alone it finds no adapter: "Could not
#               get 'vkCreateInstance'"), as amd64 .debs that run.sh unpacks
#   .whl/       the gguf wheel, for run.sh's anchors (make-bench-gguf.py)
#   .llama/     with LLAMA=DIR (what ../shared/tools/llama-vulkan-build.sh
#               wrote: llama-bench and its libraries), llama-bench.tar.xz,
#               for run.sh's anchors (xz keeps it inside the device call's
#               64 MiB)
# These folders are git-ignored through .git/info/exclude. Then run, on the
# GPU machine, from the repository root, with .gpu and .gl carried:
#   bash benches/gpu/run.sh [tests] [bench:SHAPE ...] [long:SHAPE] ...
# (see run.sh for the parts and for fitting the device's limit on one
# command).
#   BASE=0386f3c bash benches/gpu/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# .gpu, .gl, .whl and .llama are in .gitignore: the device tool carries
# them only when asked (carry), and git never takes them in.
rm -rf .gpu && mkdir -p .gpu/bin
root=$PWD
# The test binaries find fixtures and models through paths fixed at compile
# time under this checkout; run.sh links this path to its own copy.
pwd >.gpu/root
git rev-parse --short HEAD >.gpu/commit
cargo build --release -p tokenwire-benches --bin engine-bench
cp target/release/engine-bench .gpu/bin/
# The wgpu test binaries, built as `cargo test` would build them.
for t in wgpu_kernels wgpu_engine wgpu_sample wgpu_gguf; do
    exe=$(cargo test --release -p tokenwire-kernels --test "$t" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1)
    cp "$exe" ".gpu/bin/$t"
done
if [ -n "${BASE:-}" ]; then
    # The base revision in a throwaway worktree, built into this target
    # folder (the dependencies are shared; its own crates get their own
    # hashes), so the GPU call can compare before and after on one card.
    wt=$(mktemp -d)/base
    git worktree add --detach "$wt" "$BASE" >/dev/null
    (cd "$wt" && CARGO_TARGET_DIR="$root/target" cargo build --release -p tokenwire-benches --bin engine-bench)
    cp target/release/engine-bench .gpu/bin/engine-bench-base
    git -C "$wt" rev-parse --short HEAD >.gpu/base
    git worktree remove --force "$wt"
    # Put this tree's engine-bench back in target/ as well.
    cargo build --release -p tokenwire-benches --bin engine-bench
fi
strip .gpu/bin/*
debs=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
missing=()
for p in "${debs[@]}"; do
    ls .gl/"${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    mkdir -p .gl /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -qq
    # shellcheck disable=SC2086
    (cd .gl && apt-get $o download "${missing[@]}")
fi
ls .whl/gguf-0.19.0-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps --only-binary=:all: -d .whl gguf==0.19.0
if [ -n "${LLAMA:-}" ]; then
    mkdir -p .llama
    tar -C "$LLAMA" -cJf .llama/llama-bench.tar.xz .
fi
du -sh .gpu .gl .whl ${LLAMA:+.llama}
