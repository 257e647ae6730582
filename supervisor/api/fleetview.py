"""What the HTTP side needs from the daemon, and nothing more.

The API, the proxy and /metrics are written against these protocols, not against the
daemon: they read statuses, find a target's handle, ask for a reload, subscribe to
events, read the token and the LiteLLM config. The daemon implements them
(daemon/fleet.py); tests can hand in anything that does.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from supervisor.api.keys import KeyRing
from supervisor.events import Event


class ServedTarget(Protocol):
    """One target as the proxy and the API see it."""

    @property
    def name(self) -> str: ...

    @property
    def since(self) -> float:
        """When it entered its current state (wall clock)."""

    @property
    def serving(self) -> bool: ...

    @property
    def base_url(self) -> str: ...

    def upstream_model(self) -> str | None:
        """The `model` the runtime expects, or None to pass the client's body untouched."""

    def auth_headers(self) -> dict[str, str]: ...

    async def wait_serving(self, timeout: float) -> bool:
        """Until it serves (True), at most `timeout`; False at once if it will not come back."""

    def unavailable_reason(self) -> str | None:
        """Why it will not serve until someone acts; None while it serves or is coming back."""

    def relaying(self) -> AbstractAsyncContextManager[str]:
        """Entered around each proxied request: the target counts and drains them; gives the
        address to send the request to (it changes when a new server takes over)."""

    async def arriving(self, klass: str, timeout: float) -> None:
        """Before a request of class `klass` is relayed: returns once it may go (the tuner
        may switch the server first, within `timeout` seconds)."""

    def observe_final(self, final: dict[str, Any], klass: str) -> None:
        """The object at the end of a response (llama.cpp's `timings`, OpenAI's `usage`),
        for a request of class `klass` (tuning/acceptance.request_class)."""

    def restart(self, reason: str) -> None: ...

    def state_name(self) -> str: ...


class FleetView(Protocol):
    """The fleet as the HTTP side sees it."""

    @property
    def fleet_file(self) -> str: ...

    def daemon_info(self) -> dict[str, Any]: ...

    def target_statuses(self, names: list[str] | None = None) -> list[dict[str, Any]]: ...

    def target_names(self) -> list[str]: ...

    def served_target(self, name: str) -> ServedTarget | None: ...

    async def reload(self, by: str | None = None) -> tuple[bool, list[str]]:
        """(applied, problems): a bad file changes nothing and lists its problems. `by`: the
        name of the key that asked, for the reload's event."""

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Every event as it happens; returns the function that unsubscribes."""

    def keyring(self) -> KeyRing:
        """The keys of the API and the proxy (keys.py), each read at every use."""

    def litellm_config(self) -> dict[str, Any]: ...

    # --- for the status page (docs/ui.md) ---

    def record_request(self, target: str, status: int, started: float, duration: float,
                       stream: bool, final: dict[str, Any] | None,
                       error: str | None = None, key: str | None = None) -> None:
        """A request through the proxy, for the activity list; `final` is the object at the
        end of its response that says what it used (timings, usage), if any; `key` the name
        of the key it came with (never the key)."""

    def recent_requests(self, limit: int | None = None) -> list[dict[str, Any]]: ...

    def history(self, name: str, since: float | None = None) -> dict[str, Any]: ...

    def tuning(self, name: str) -> dict[str, Any]:
        """Why the target runs its setting: measurements and decisions (tuning/evidence.py)."""

    def log_tail(self, name: str, lines: int) -> list[str]: ...
