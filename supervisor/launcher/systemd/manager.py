"""The systemd manager over D-Bus (dbus-fast, asyncio): method calls and the signals that
replace polling (JobRemoved for jobs, PropertiesChanged for a unit's state).

Low-level messages rather than introspected proxies: the calls are few and fixed, and a
proxy per unit would cost an Introspect round trip at every start.

dbus-fast is imported by the methods that use it: a daemon whose targets are not on systemd
never connects, and never loads it (2.8 MB of its memory).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from supervisor.errors import SpecfleetError

if TYPE_CHECKING:
    from dbus_fast import Message
    from dbus_fast.aio import MessageBus

DEST = "org.freedesktop.systemd1"
PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
PROPERTIES = "org.freedesktop.DBus.Properties"


class SystemdError(SpecfleetError):
    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name  # the D-Bus error name, e.g. org.freedesktop.systemd1.NoSuchUnit


class SystemdManager:
    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self._jobs: dict[str, asyncio.Future[str]] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()  # jobs nobody waited for (yet)
        self._watchers: dict[str, list[Callable[[dict[str, Any]], None]]] = {}
        bus.add_message_handler(self._on_message)

    @classmethod
    async def connect(cls, user: bool = False) -> SystemdManager:
        from dbus_fast import BusType
        from dbus_fast.aio import MessageBus

        try:
            bus = await MessageBus(bus_type=BusType.SESSION if user else BusType.SYSTEM).connect()
        except (OSError, ValueError, Exception) as exc:  # dbus-fast raises its own types too
            scope = "user (session)" if user else "system"
            raise SpecfleetError(f"cannot reach the {scope} D-Bus to talk to systemd: {exc}; "
                                 "is systemd running here? (launcher: systemd needs it)") from exc
        manager = cls(bus)
        for rule in (f"type='signal',sender='{DEST}',interface='{MANAGER}',member='JobRemoved'",
                     f"type='signal',sender='{DEST}',interface='{PROPERTIES}',"
                     "member='PropertiesChanged',path_namespace='/org/freedesktop/systemd1/unit'"):
            await manager._call("AddMatch", "s", [rule], dest="org.freedesktop.DBus",
                                path="/org/freedesktop/DBus", interface="org.freedesktop.DBus")
        await manager.call("Subscribe")  # else systemd emits no unit signals to us
        return manager

    def close(self) -> None:
        self.bus.disconnect()

    # --- calls ---

    async def _call(self, member: str, signature: str = "", body: list[Any] | None = None, *,
                    dest: str = DEST, path: str = PATH, interface: str = MANAGER) -> list[Any]:
        from dbus_fast import Message, MessageType

        reply = await self.bus.call(Message(destination=dest, path=path, interface=interface,
                                            member=member, signature=signature, body=body or []))
        if reply is None:
            raise SystemdError(f"systemd did not answer {member}")
        if reply.message_type == MessageType.ERROR:
            detail = reply.body[0] if reply.body else reply.error_name
            raise SystemdError(f"systemd refused {member}: {detail}", reply.error_name or "")
        return list(reply.body)

    async def call(self, member: str, signature: str = "", body: list[Any] | None = None) -> list[Any]:
        return await self._call(member, signature, body)

    async def unit_path(self, unit: str) -> str:
        return str((await self.call("LoadUnit", "s", [unit]))[0])

    async def properties(self, path: str, interface: str) -> dict[str, Any]:
        (values,) = await self._call("GetAll", "s", [interface], path=path, interface=PROPERTIES)
        return {k: v.value for k, v in values.items()}

    async def reload(self) -> None:
        """`systemctl daemon-reload`: returns when the manager has reread its unit files."""
        await self.call("Reload")

    async def run_job(self, member: str, unit: str, *extra: Any) -> str:
        """StartUnit/StopUnit/RestartUnit: wait for the job's JobRemoved; return its result
        (done, canceled, timeout, failed, dependency, skipped)."""
        signature = "ss" + "".join("s" for _ in extra)
        (job,) = await self.call(member, signature, [unit, "replace", *extra])
        job = str(job)
        # JobRemoved may arrive before this coroutine resumes after the reply.
        if job in self._finished:
            return self._finished.pop(job)
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._jobs[job] = fut
        return await fut

    async def kill(self, unit: str, who: str, signal: int) -> None:
        await self.call("KillUnit", "ssi", [unit, who, signal])

    async def reset_failed(self, unit: str) -> None:
        try:
            await self.call("ResetFailedUnit", "s", [unit])
        except SystemdError as exc:
            if "NoSuchUnit" not in exc.name and "not loaded" not in str(exc):
                raise

    async def list_units(self, patterns: list[str]) -> list[tuple[str, str, str]]:
        """(name, active state, sub state) of loaded units matching the glob patterns."""
        (units,) = await self.call("ListUnitsByPatterns", "asas", [[], patterns])
        return [(str(u[0]), str(u[3]), str(u[4])) for u in units]

    # --- signals ---

    def watch(self, path: str, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call `callback(changed properties)` on each PropertiesChanged of a unit object;
        returns the function that stops watching."""
        self._watchers.setdefault(path, []).append(callback)

        def unwatch() -> None:
            callbacks = self._watchers.get(path, [])
            if callback in callbacks:
                callbacks.remove(callback)
        return unwatch

    def _on_message(self, msg: Message) -> bool:
        from dbus_fast import MessageType, Variant

        if msg.message_type != MessageType.SIGNAL:
            return False
        if msg.member == "JobRemoved" and msg.interface == MANAGER:
            _, job, _, result = msg.body
            if (fut := self._jobs.pop(str(job), None)) is not None:
                if not fut.done():
                    fut.set_result(str(result))
            else:
                self._finished[str(job)] = str(result)
                while len(self._finished) > 256:
                    self._finished.popitem(last=False)
        elif msg.member == "PropertiesChanged" and msg.path in self._watchers:
            _, changed, _ = msg.body
            values = {k: v.value if isinstance(v, Variant) else v for k, v in changed.items()}
            for callback in list(self._watchers[msg.path]):
                callback(values)
        return False
