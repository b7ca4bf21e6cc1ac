#!/usr/bin/env bash
# Prompt scoring on both sides (benches/llama_cpp/score.py): starts
# `tokenwire serve --prefix-cache off` on FILE (so the plain prefill it
# times for scale finds no blocks the scoring computed) and a second with
# `--cpu-activations f32` as the reference, then llama.cpp (LLAMA_PY names
# the interpreter with llama-cpp-python) and the server take turns on the
# same inputs, ROUNDS times.
#
# Usage: benches/llama_cpp/score.sh FILE.gguf [INPUTS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
file="$1"; inputs="${2:-32}"; rounds="${3:-3}"
py="${LLAMA_PY:-python3}"
port="${PORT:-18094}"
cargo build --quiet --release -p tokenwire-io
./target/release/tokenwire serve --model "$file" --prefix-cache off --listen "127.0.0.1:$port" \
  > /tmp/tokenwire-score-bench.log 2>&1 &
server=$!
# The reference both sides' 8-bit paths are judged against: tokenwire's
# f32 path on the same file.
./target/release/tokenwire serve --model "$file" --prefix-cache off --cpu-activations f32 \
  --listen "127.0.0.1:$((port + 1))" > /tmp/tokenwire-score-bench-f32.log 2>&1 &
reference=$!
trap 'kill $server $reference 2>/dev/null || true' EXIT
for p in "$port" "$((port + 1))"; do
  for _ in $(seq 300); do
    curl -sf "127.0.0.1:$p/health" > /dev/null && break
    sleep 0.2
  done
done
name="$(basename "$file" .gguf)"
uptime
"$py" benches/llama_cpp/score.py "$file" --url "http://127.0.0.1:$port" \
  --reference "http://127.0.0.1:$((port + 1))" --name "$name" \
  --inputs "$inputs" --rounds "$rounds"
uptime
