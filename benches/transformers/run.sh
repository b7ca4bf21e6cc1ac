#!/usr/bin/env bash
# Every architecture tokenwire runs against Hugging Face transformers
# (benches/transformers/parity.py): PY names an interpreter with torch and
# transformers (for example a venv made with `pip install torch
# transformers==4.46.3`; not the SDK venv, which has no torch).
#
# Usage: PY=/path/to/python benches/transformers/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --quiet --release -p tokenwire-io
"${PY:-python3}" benches/transformers/parity.py "$@"
