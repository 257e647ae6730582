"""Listening sockets handed over by systemd (socket activation, sd_listen_fds(3)).

Under `specfleet.socket` (written by `specfleet units install`) systemd itself holds the
API's and the proxy's listening sockets and passes them to each daemon it starts: file
descriptors from 3 on, `LISTEN_FDS` of them, for the process `LISTEN_PID`. Because systemd
keeps its copy open, a connection that arrives while the daemon restarts (`systemctl
restart specfleet`, an upgrade) waits in the socket's backlog and is answered by the next
daemon, instead of being refused. Each socket is matched to `daemon.api` or
`daemon.proxy.listen` by the address it is bound to; one that matches neither is closed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

SD_LISTEN_FDS_START = 3
_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def inherited(environ: MutableMapping[str, str] | None = None) -> list[socket.socket]:
    """The TCP sockets systemd passed to this process (none when it passed none); the
    variables are removed, so that the runtimes the daemon starts do not take them as theirs."""
    env = os.environ if environ is None else environ
    passed = env.get("LISTEN_PID") == str(os.getpid())
    count = int(env.get("LISTEN_FDS") or 0) if passed else 0
    for var in _VARS:
        env.pop(var, None)
    found = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)  # a runtime must never hold the daemon's port
        sock = socket.socket(fileno=fd)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            found.append(sock)
        else:
            sock.detach()  # not ours to use (nor to close: systemd's unit said so)
    return found


def take(sockets: list[socket.socket], address: str) -> socket.socket | None:
    """The socket bound to HOST:PORT `address`, removed from `sockets`; by port alone when
    the host is a name (`localhost:9910`) and one socket has that port."""
    host, _, port = address.rpartition(":")
    host, number = host.strip("[]"), int(port)
    same_port = [s for s in sockets if s.getsockname()[1] == number]
    exact = [s for s in same_port if s.getsockname()[0] == host]
    chosen = exact[0] if exact else same_port[0] if len(same_port) == 1 else None
    if chosen is not None:
        sockets.remove(chosen)
    return chosen
