#!/usr/bin/env bash
# The quick start: set up everything (scripts/setup.sh; each part is skipped when already
# there), then run examples/quickstart.yaml. On a terminal the fleet runs in the
# foreground until Ctrl-C (`specfleet status` in another shell shows it). Without a
# terminal (CI, a pipe) it runs until both targets have answered a completion through the proxy,
# shows the status and stops: the same command then proves the set-up and ends.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ -t 0 ] && [ -t 1 ]; then
    exec .venv/bin/specfleet run examples/quickstart.yaml "$@"
fi
exec .venv/bin/python scripts/quickstart_check.py examples/quickstart.yaml
