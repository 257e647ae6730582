"""llama-server's /metrics (Prometheus text) as a MetricsSample: the shared reader of
llama.cpp's counter names (supervisor.plugin's llamacpp_counters; RUNTIMES.md)."""

from __future__ import annotations

from supervisor.plugin import llamacpp_counters as parse_metrics

__all__ = ["parse_metrics"]
