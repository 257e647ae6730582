"""A llama-server image for launcher: container tests, built here without any registry
(registries cannot be reached from these machines): the real llama-server from specfleet's
cache and the shared libraries `ldd` lists, copied into a root directory, tarred and
`podman import`ed. Also the settings this sandbox needs to run containers at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

# Lower than this sandbox's limits, which it cannot raise (no CAP_SYS_RESOURCE): a container
# asking for more is refused. runc: crun refuses this machine's hybrid cgroup layout.
SANDBOX = {"runtime": "runc", "ulimits": ["nofile=4096:4096", "nproc=4096:4096"]}
# podman's own default ulimits (the host's hard limits) are refused here the same way.
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"


def podman_or_skip() -> None:
    """Skip, saying why, where podman and runc are not installed (.ci/run installs them)."""
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install podman runc, as "
                    ".ci/run does): the container tests need a real engine")


def use_sandbox_conf(directory: Path) -> None:
    """CONTAINERS_CONF for this process and the daemons it starts (they inherit it)."""
    conf = directory / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    os.environ["CONTAINERS_CONF"] = str(conf)


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)  # "libm.so.6 => /lib/.../libm.so.6 (0x...)"
        if m:
            found.append(m.group(1))
    return found


def build_image(binary: str, work: Path) -> str:
    """`localhost/specfleet-test-llama:<hash of the binary>`, imported once per binary."""
    digest = hashlib.sha256(Path(binary).read_bytes()).hexdigest()[:12]
    tag = f"localhost/specfleet-test-llama:{digest}"
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode == 0:
        return tag
    root = work / "rootfs"
    (root / "usr/local/bin").mkdir(parents=True)
    shutil.copy2(binary, root / "usr/local/bin/llama-server")
    for lib in _libraries(binary):
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)  # follows symlinks: the file under the name the loader asks
    (root / "tmp").mkdir(mode=0o1777)
    archive = work / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".")
    subprocess.run(["podman", "import", "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin",
                    str(archive), tag], check=True, capture_output=True)
    return tag


def containers_of(owner: str) -> list[dict[str, str]]:
    """This state dir's containers (running or not): name, state, target label."""
    out = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"label=io.specfleet.daemon={owner}", "--format",
         "json"], capture_output=True, text=True, check=True).stdout
    return [{"name": c["Names"][0], "state": c["State"],
             "target": (c.get("Labels") or {}).get("io.specfleet.target", "")}
            for c in json.loads(out or "[]")]


def remove_containers_of(owner: str) -> list[str]:
    names = [row["name"] for row in containers_of(owner)]
    if names:
        subprocess.run(["podman", "rm", "-f", *names], capture_output=True, check=False)
    return names


def can_run_or_skip(tag: str) -> None:
    """Skip, with podman's own message, where this machine cannot run a container at all
    (the engine installed but refused by the kernel or the sandbox)."""
    proc = subprocess.run(["podman", "run", "--rm", "--runtime", SANDBOX["runtime"],
                           *[f"--ulimit={u}" for u in SANDBOX["ulimits"]], "--network", "host",
                           "--entrypoint", "llama-server", tag, "--version"],
                          capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        pytest.skip(f"podman cannot run a container on this machine: {proc.stderr.strip()}")


@pytest.fixture(scope="module")
def image(llama_server_bin: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The llama-server image of a module's container tests (a pytest plugin of conftest.py:
    the container launcher's tests and the SIGTERM test use it); skips without podman."""
    podman_or_skip()
    work = tmp_path_factory.mktemp("image")
    use_sandbox_conf(work)
    tag = build_image(llama_server_bin, work)
    can_run_or_skip(tag)
    return tag
