#!/usr/bin/env bash
# The Debian packages some tests need, beyond Python's:
#   chromium        tests/api/test_ui_browser.py (the status page in a real browser)
#   podman, runc    tests/launcher/test_container_live.py (the container launcher, live; runc
#                   because crun cannot run on these machines' cgroup layout)
#   docker-registry tests/registry/test_registry_live.py (a real OCI registry on loopback)
#   prometheus      tests/api/test_keys_live.py (Debian's Prometheus scrapes /metrics with a read key)
# `install`: apt-get installs the missing ones, as root or with passwordless sudo.
# `report`: says which are missing, which tests skip without them and the one command
# that installs them; says nothing when none is missing.
set -euo pipefail
PACKAGES=(chromium podman runc docker-registry prometheus)

missing() {
    local p
    for p in "${PACKAGES[@]}"; do command -v "$p" >/dev/null || echo "$p"; done
}

install() {
    local as_root=()
    [ "$(id -u)" = 0 ] || as_root=(sudo -n)
    command -v apt-get >/dev/null && "${as_root[@]}" true 2>/dev/null || return 0
    echo "installing ${*} with apt-get (about a minute, more on a slow mirror)"
    apt_get() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y "$@"; }
    # A fresh machine's package lists may be missing or stale: update once and retry.
    apt_get install "$@" || { apt_get update && apt_get install "$@"; } \
        || echo "apt-get could not install ${*}; its message is above"
}

report() {
    echo "Not installed: ${*} (installing needs apt-get and root or passwordless sudo)."
    echo "Without them these tests skip, each saying why:"
    [[ " $* " != *" chromium "* ]] \
        || echo "  tests/api/test_ui_browser.py (the status page in a real browser)"
    [[ " $* " != *" podman "* && " $* " != *" runc "* ]] \
        || echo "  tests/launcher/test_container_live.py (the container launcher with podman and runc, live)"
    [[ " $* " != *" docker-registry "* ]] \
        || echo "  tests/registry/test_registry_live.py (models from a real OCI registry on loopback)"
    [[ " $* " != *" prometheus "* ]] \
        || echo "  tests/api/test_keys_live.py's Prometheus scrape (/metrics with a read key)"
    echo "To run them: sudo apt-get install ${*}"
}

mapfile -t absent < <(missing)
case ${1:-} in
    install) if [ ${#absent[@]} -gt 0 ]; then install "${absent[@]}"
             else echo "${PACKAGES[*]}: installed"; fi;;
    report) [ ${#absent[@]} -eq 0 ] || report "${absent[@]}";;
    *) echo "usage: $0 install|report" >&2; exit 2;;
esac
