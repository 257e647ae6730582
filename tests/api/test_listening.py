"""Sockets handed over by systemd (api/listening.py): found by LISTEN_PID/LISTEN_FDS, kept
from the runtimes, matched to the configured addresses. Real sockets, a real child process
with the socket at fd 3 as systemd passes it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from supervisor.api import listening
from tests.conftest import REPO


def bound(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.bind((host, 0))
    s.listen()
    return s


def test_each_address_takes_its_own_socket_and_a_host_name_takes_it_by_port():
    api, proxy = bound(), bound()
    handed = [api, proxy]
    try:
        assert listening.take(handed, f"127.0.0.1:{proxy.getsockname()[1]}") is proxy
        assert listening.take(handed, "127.0.0.1:1") is None and handed == [api]
        assert listening.take(handed, f"localhost:{api.getsockname()[1]}") is api
        assert handed == []
    finally:
        api.close()
        proxy.close()


CHILD = """
import json, os, subprocess, sys
from supervisor.api import listening
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
socks = listening.inherited()
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LISTEN_FDS'))"],
                       capture_output=True, text=True, close_fds=False).stdout.strip()
print(json.dumps({"ports": [s.getsockname()[1] for s in socks],
                  "inheritable": [os.get_inheritable(s.fileno()) for s in socks],
                  "env_left": child, "mine": listening.inherited() == []}))
"""


def test_the_socket_at_fd_3_is_found_then_hidden_from_children():
    sock = bound()
    try:
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                             check=True, cwd=REPO, pass_fds=(sock.fileno(), 3),
                             preexec_fn=lambda: os.dup2(sock.fileno(), 3))  # 3 kept: in pass_fds
        seen = json.loads(out.stdout)
        assert seen == {"ports": [sock.getsockname()[1]], "inheritable": [False],
                        "env_left": "None", "mine": True}
    finally:
        sock.close()
