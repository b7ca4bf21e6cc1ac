#!/usr/bin/env bash
# BENCHMARKS.md's prefix-caching figures, both sides in one run: tokenwire
# with the prefix cache on and off, and llama.cpp's server
# (llama-cpp-python's `llama_cpp.server`, LLAMA_PY names the interpreter of a
# venv that has it and `websockets`), on the same GGUF file with THREADS
# threads each, then benches/conversation/bench.py against all three.
#
# Usage: benches/conversation/run.sh FILE.gguf [THREADS] [ROUNDS] [MAX_TOKENS]
# A venv for LLAMA_PY (llama.cpp built from source with native flags):
#   python3 -m venv /tmp/llama && CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/llama/bin/pip install \
#     --no-binary llama-cpp-python "llama-cpp-python[server]==0.3.36" websockets
set -euo pipefail
cd "$(dirname "$0")/../.."
file="$1"; threads="${2:-2}"; rounds="${3:-3}"; max_tokens="${4:-64}"
py="${LLAMA_PY:-python3}"
cargo build --quiet --release -p tokenwire-io --bin tokenwire
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
serve() { # PORT FLAGS...
  local port="$1"; shift
  RAYON_NUM_THREADS="$threads" ./target/release/tokenwire serve --model "$file" \
    --listen "127.0.0.1:$port" "$@" >"target/bench-tokenwire-$port.log" 2>&1 &
  pids+=($!)
}
serve 18201 --prefix-cache on
serve 18202 --prefix-cache off
"$py" -m llama_cpp.server --model "$file" --n_threads "$threads" --n_threads_batch "$threads" \
  --n_ctx 4096 --host 127.0.0.1 --port 18203 >target/bench-llama.log 2>&1 &
pids+=($!)
for url in http://127.0.0.1:18201/health http://127.0.0.1:18202/health http://127.0.0.1:18203/v1/models; do
  for _ in $(seq 600); do curl -sf "$url" >/dev/null && break; sleep 0.2; done
  curl -sf "$url" >/dev/null || { echo "not up: $url"; tail target/bench-*.log; exit 1; }
done
uptime
"$py" benches/conversation/bench.py --tokenwire http://127.0.0.1:18201 \
  --tokenwire-off http://127.0.0.1:18202 --llama http://127.0.0.1:18203 \
  --rounds "$rounds" --max-tokens "$max_tokens"
uptime
