#!/usr/bin/env bash
# BENCHMARKS.md's 8-bit accuracy comparison: tokenwire's 8-bit-activation
# path and llama.cpp's (llama-cpp-python, LLAMA_PY names its interpreter),
# each judged against tokenwire's f32 path on the same GGUF file and the
# same token windows of a public-domain text (benches/texts/).
#
# Usage: benches/llama_cpp/kl.sh FILE.gguf [TEXT] [WINDOW] [WINDOWS]
set -euo pipefail
cd "$(dirname "$0")/../.."
file="$1"; text="${2:-benches/texts/lincoln-1861.txt}"; window="${3:-512}"; windows="${4:-16}"
py="${LLAMA_PY:-python3}"
cargo build --quiet --release -p tokenwire-benches --bin quant-kl
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
./target/release/quant-kl --gguf "$file" --text "$text" --window "$window" --windows "$windows" \
  --ids-out "$tmp/ids.json" --ref-out "$tmp/ref.f32" --kl-out "$tmp/kl.f64"
"$py" benches/llama_cpp/kl.py "$file" --ids "$tmp/ids.json" --ref "$tmp/ref.f32" --ours "$tmp/kl.f64"
