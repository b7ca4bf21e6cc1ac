#!/usr/bin/env bash
# BENCHMARKS.md's speculative-decoding figures, both sides in one run:
# tokenwire with drafting off and on (--draft-tokens N) on the same GGUF file
# with THREADS threads each, requests one at a time, alternating.
#
# Usage: benches/speculative/run.sh FILE.gguf [DRAFT_TOKENS] [THREADS] [ROUNDS] [MAX_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/../.."
file="$1"; draft="${2:-8}"; threads="${3:-2}"; rounds="${4:-3}"; max_tokens="${5:-200}"
cargo build --quiet --release -p tokenwire-io --bin tokenwire
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
serve() { # PORT FLAGS...
  local port="$1"; shift
  RAYON_NUM_THREADS="$threads" ./target/release/tokenwire serve --model "$file" \
    --listen "127.0.0.1:$port" "$@" >"target/bench-tokenwire-$port.log" 2>&1 &
  pids+=($!)
}
serve 18211 --draft-tokens 0
serve 18212 --draft-tokens "$draft"
for url in http://127.0.0.1:18211/health http://127.0.0.1:18212/health; do
  for _ in $(seq 600); do curl -sf "$url" >/dev/null && break; sleep 0.2; done
  curl -sf "$url" >/dev/null || { echo "not up: $url"; tail target/bench-*.log; exit 1; }
done
uptime
python3 benches/speculative/bench.py --off http://127.0.0.1:18211 --on http://127.0.0.1:18212 \
  --rounds "$rounds" --max-tokens "$max_tokens"
uptime
