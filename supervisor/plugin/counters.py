"""The speculation counters of the two runtimes whose metric names other servers follow:
llama.cpp's `llamacpp:*` (its forks, servers built on its server) and vLLM's `vllm:*`
(SGLang-style servers that copy them), each read from Prometheus text into a
MetricsSample. The built-in backends read their own servers with these; the `command`
backend reads any server that says which names it follows (RUNTIMES.md has the names)."""

from __future__ import annotations

from supervisor.plugin.promtext import dense_positions
from supervisor.plugin.promtext import parse as parse_prometheus
from supervisor.plugin.values import MetricsSample


def llamacpp_counters(text: str, process_start: float | None = None) -> MetricsSample:
    """llama-server's /metrics."""
    s = parse_prometheus(text)
    per_pos = s.by_label("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "position")
    return MetricsSample(
        process_start=process_start,
        drafts=int(s.total("llamacpp:spec_decode_num_drafts_total")),
        draft_tokens=int(s.total("llamacpp:spec_decode_num_draft_tokens_total")),
        accepted_tokens=int(s.total("llamacpp:spec_decode_num_accepted_tokens_total")),
        accepted_per_position=dense_positions(per_pos),
        tokens_predicted=int(s.total("llamacpp:tokens_predicted_total")),
        tokens_predicted_seconds=s.total("llamacpp:tokens_predicted_seconds_total"),
        prompt_tokens=int(s.total("llamacpp:prompt_tokens_total")),
        requests_processing=int(s.total("llamacpp:requests_processing")),
        requests_deferred=int(s.total("llamacpp:requests_deferred")),
    )


def vllm_counters(text: str) -> MetricsSample:
    """vLLM's /metrics: counters per engine (label `engine`), summed over engines."""
    s = parse_prometheus(text)
    started = s.by_name.get("process_start_time_seconds")
    tokens = s.total("vllm:request_generation_tokens_sum") if \
        "vllm:request_generation_tokens_sum" in s else s.total("vllm:generation_tokens_total")
    return MetricsSample(
        process_start=min(v for _, v in started) if started else None,
        drafts=int(s.total("vllm:spec_decode_num_drafts_total")),
        draft_tokens=int(s.total("vllm:spec_decode_num_draft_tokens_total")),
        accepted_tokens=int(s.total("vllm:spec_decode_num_accepted_tokens_total")),
        accepted_per_position=dense_positions(
            s.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")),
        tokens_predicted=int(tokens),
        tokens_predicted_seconds=s.total("vllm:request_decode_time_seconds_sum"),
        prompt_tokens=int(s.total("vllm:prompt_tokens_total")),
        requests_processing=int(s.total("vllm:num_requests_running")),
        requests_deferred=int(s.total("vllm:num_requests_waiting")),
    )
