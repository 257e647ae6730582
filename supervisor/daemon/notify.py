"""sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET.

Hand-written because the protocol is a single sendto(); the PyPI `sdnotify` package
is unmaintained since 2017 and handles neither abstract sockets nor errors.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Talks to the service manager if it started us with Type=notify; else does nothing."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # An abstract socket is given as "@name"; its address starts with a NUL byte.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 1e6 if usec.isdigit() and mine else None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        if not self.address:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto("\n".join(fields).encode(), self.address)
            except OSError:
                return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")
