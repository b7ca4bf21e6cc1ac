#!/usr/bin/env bash
# BENCHMARKS.md's structured-output cost: one tokenwire server on FILE with
# THREADS threads, then benches/structured/bench.py, which times the same
# chat request's decode with and without a JSON schema, alternating, in one
# run against that one server.
#
# Usage: benches/structured/run.sh FILE.gguf [THREADS] [ROUNDS] [MAX_TOKENS]
# BACKEND=wgpu runs the wgpu engine instead of the CPU one.
set -euo pipefail
cd "$(dirname "$0")/../.."
file="$1"; threads="${2:-2}"; rounds="${3:-10}"; max_tokens="${4:-128}"
cargo build --quiet --release -p tokenwire-io --bin tokenwire
RAYON_NUM_THREADS="$threads" ./target/release/tokenwire serve --model "$file" \
  --backend "${BACKEND:-cpu}" --listen 127.0.0.1:18211 >target/bench-structured.log 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf http://127.0.0.1:18211/health >/dev/null && break; sleep 0.2; done
curl -sf http://127.0.0.1:18211/health >/dev/null || { tail target/bench-structured.log; exit 1; }
uptime
python3 benches/structured/bench.py --url http://127.0.0.1:18211 --rounds "$rounds" --max-tokens "$max_tokens"
