#!/usr/bin/env bash
# Embeddings on both sides (benches/llama_cpp/embed.py): starts
# `tokenwire serve --pooling mean` on FILE, then llama.cpp (LLAMA_PY names
# the interpreter with llama-cpp-python) and the server take turns on the
# same inputs, ROUNDS times.
#
# Usage: benches/llama_cpp/embed.sh FILE.gguf [INPUTS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
file="$1"; inputs="${2:-64}"; rounds="${3:-3}"
py="${LLAMA_PY:-python3}"
port="${PORT:-18093}"
cargo build --quiet --release -p tokenwire-io
./target/release/tokenwire serve --model "$file" --pooling mean --listen "127.0.0.1:$port" \
  > /tmp/tokenwire-embed-bench.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -sf "127.0.0.1:$port/health" > /dev/null && break
  sleep 0.2
done
name="$(basename "$file" .gguf)"
uptime
"$py" benches/llama_cpp/embed.py "$file" --url "http://127.0.0.1:$port" --name "$name" \
  --inputs "$inputs" --rounds "$rounds"
uptime
