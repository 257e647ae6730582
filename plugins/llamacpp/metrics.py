"""llama-server's /metrics (Prometheus text) as a MetricsSample; the counter names are
RUNTIMES.md's."""

from __future__ import annotations

from supervisor.plugin import MetricsSample, dense_positions, parse_prometheus


def parse_metrics(text: str, process_start: float | None) -> MetricsSample:
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
