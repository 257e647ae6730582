"""llama.cpp `llama-server` backend: the backend class, and the build of llama-server that
`specfleet setup` provisions (the embedded default runtime)."""

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.plugin import hookimpl

__all__ = ["LlamaCppBackend", "register_backends"]


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(LlamaCppBackend)
