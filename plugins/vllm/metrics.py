"""vLLM's /metrics (Prometheus text) as a MetricsSample: the shared reader of vLLM's
counter names (supervisor.plugin's vllm_counters; RUNTIMES.md)."""

from __future__ import annotations

from supervisor.plugin import vllm_counters as parse_metrics

__all__ = ["parse_metrics"]
