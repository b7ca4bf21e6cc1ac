#!/usr/bin/env bash
# Builds, on this machine, everything benches/gpu/run.sh needs on a GPU
# machine that has no Rust toolchain and no network:
#   .gpu/bin/   engine-bench and the wgpu test binaries (release, stripped)
#   .gl/        the Vulkan loader packages (unpacked there by run.sh)
# Both folders are git-ignored through .git/info/exclude. Then run, on the
# GPU machine, from the repository root, with .gpu and .gl carried:
#   bash benches/gpu/run.sh [tests] [bench:SHAPE ...] [anchor]
# (all three parts when given none; see run.sh for fitting the device's
# 10-minute limit on one command).
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for d in /.gpu/ /.gl/; do
    grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >>"$exclude"
done
rm -rf .gpu && mkdir -p .gpu/bin
# The test binaries find fixtures and models through paths fixed at compile
# time under this checkout; run.sh links this path to its own copy.
pwd >.gpu/root
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
strip .gpu/bin/*
if [ ! -d .gl ] || [ -z "$(ls .gl/*.deb 2>/dev/null)" ]; then
    mkdir -p .gl /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -qq
    # shellcheck disable=SC2086
    (cd .gl && apt-get $o download libvulkan1)
fi
du -sh .gpu .gl
