"""vLLM's /metrics (Prometheus text) as a MetricsSample; the counter names are
RUNTIMES.md's."""

from __future__ import annotations

from supervisor.plugin import MetricsSample, dense_positions, parse_prometheus


def parse_metrics(text: str) -> MetricsSample:
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
