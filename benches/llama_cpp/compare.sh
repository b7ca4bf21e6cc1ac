#!/usr/bin/env bash
# Both sides of BENCHMARKS.md's CPU table, one after the other, ROUNDS times:
# llama.cpp (llama-cpp-python, LLAMA_PY names its interpreter) and
# tokenwire's engine-bench, on the same GGUF file, prompt and decode steps,
# at 1 and 2 threads.
#
# Usage: benches/llama_cpp/compare.sh FILE.gguf [PROMPT] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
file="$1"; prompt="${2:-128}"; steps="${3:-64}"; rounds="${4:-3}"
py="${LLAMA_PY:-python3}"
cargo build --quiet --release -p tokenwire-benches --bin engine-bench
uptime
for round in $(seq "$rounds"); do
  echo "round $round"
  "$py" benches/llama_cpp/bench.py "$file" --threads 1,2 --prompt "$prompt" --steps "$steps"
  for t in 1 2; do
    RAYON_NUM_THREADS=$t ./target/release/engine-bench --gguf "$file" --backend cpu \
      --batch 1 --prompt "$prompt" --steps "$steps" | tail -1 | sed "s/^/tokenwire threads $t: /"
  done
done
uptime
