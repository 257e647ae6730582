"""llama.cpp `llama-server` backend: the backend class, and the build of llama-server that
`specfleet setup` provisions (the embedded default runtime)."""

from plugins.llamacpp.backend import (
    LlamaCppBackend,
    check_help_text,
    context_settings,
    method_args,
    parse_metrics,
)
from supervisor.plugin import hookimpl

__all__ = ["LlamaCppBackend", "check_help_text", "context_settings", "method_args",
           "parse_metrics", "register_backends"]


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(LlamaCppBackend)
