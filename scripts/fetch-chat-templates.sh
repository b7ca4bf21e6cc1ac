#!/usr/bin/env bash
# Fetches the real chat templates of llama.cpp's collection (its
# models/templates/*.jinja: Qwen, Llama 3.x, Mistral, DeepSeek, Gemma,
# Granite and more, as their model repositories publish them), for the
# kernels' real-template test. They ship in the llama-cpp-python 0.3.36
# sdist on PyPI (llama.cpp vendored); pip downloads exactly that file, its
# SHA-256 is checked, and only the templates are unpacked.
#
# Usage: scripts/fetch-chat-templates.sh [DIR]   (default: target/chat-templates)
# Prints the folder. Does nothing when it is there.
# PYTHON names the interpreter whose pip downloads it (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/chat-templates}"
version="0.3.36"
sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --no-deps \
  --no-binary llama-cpp-python -d "$tmp" "llama-cpp-python==$version" >&2
sdist="$tmp/llama_cpp_python-$version.tar.gz"
if ! echo "$sha256  $sdist" | sha256sum --check --status; then
  echo "fetch-chat-templates: llama-cpp-python $version's sdist does not have SHA-256 $sha256" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir"
tar -xzf "$sdist" -C "$tmp" --wildcards "llama_cpp_python-$version/vendor/llama.cpp/models/templates/*.jinja"
cp "$tmp/llama_cpp_python-$version/vendor/llama.cpp/models/templates/"*.jinja "$dir"/
touch "$dir/.complete"
echo "$dir"
