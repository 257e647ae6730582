#!/usr/bin/env bash
# The quick start: set up (if needed), then run examples/quickstart.yaml in the
# foreground. Ctrl-C stops the fleet; `specfleet status` in another shell shows it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/specfleet run examples/quickstart.yaml "$@"
