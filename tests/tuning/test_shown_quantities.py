"""One set of counters, three views: `specfleet status`, /v1/targets and /metrics show the
same acceptance rate, mean accepted length, tokens/s and draft length (tuning/quantities.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from supervisor.api.keys import KeyRing
from supervisor.api.server import ApiServer
from supervisor.cli import statusview
from supervisor.config.schema import Fleet, Target
from supervisor.events import Event, EventBus
from supervisor.plugin import MetricsSample
from supervisor.supervision.owner import TargetSupervisor
from supervisor.tuning.quantities import shown
from supervisor.tuning.window import AcceptanceWindow
from tests.lifecycle_doubles import FakeBackend, FakeLauncher, World

# 100 verification steps with a draft, 400 draft tokens, 150 accepted; 1000 tokens in 20 s.
COUNTERS = MetricsSample(process_start=1.0, drafts=100, draft_tokens=400, accepted_tokens=150,
                         accepted_per_position=(80, 50, 20), tokens_predicted=1000,
                         tokens_predicted_seconds=20.0)


class OneTargetFleet:
    """The smallest FleetView: one target supervisor, no token."""

    def __init__(self, sup: TargetSupervisor, bus: EventBus) -> None:
        self.sup, self.bus = sup, bus
        self.fleet_file = "fleet.yaml"

    def daemon_info(self) -> dict[str, Any]:
        return {"status": "ok"}

    def target_statuses(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        return [asdict(self.sup.status())]

    def target_names(self) -> list[str]:
        return [self.sup.name]

    def served_target(self, name: str) -> TargetSupervisor | None:
        return self.sup if name == self.sup.name else None

    async def reload(self, by: str | None = None) -> tuple[bool, list[str]]:
        return True, []

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        return self.bus.subscribe(fn)

    def keyring(self) -> KeyRing:
        return KeyRing(lambda: Fleet(version=1, targets={}))

    def litellm_config(self) -> dict[str, Any]:
        return {}


def test_mean_accepted_length_counts_the_targets_own_token_from_window_or_counters():
    window = AcceptanceWindow()
    window.observe(COUNTERS, now=0.0)
    from_window = shown(window.stats(), COUNTERS, method="ngram", speculating=True,
                        draft_length=4)
    from_counters = shown(None, COUNTERS, method="ngram", speculating=True, draft_length=4)
    assert from_window["source"] == "window" and from_counters["source"] == "counters"
    for view in (from_window, from_counters):
        assert view["mean_accepted_length"] == 2.5  # 1 + 150 / 100
        assert view["acceptance_rate"] == 0.375
        assert view["tokens_per_second"] == 50.0
        assert view["draft_length"] == 4
    assert shown(None, COUNTERS, method="ngram", speculating=False, draft_length=4)[
        "draft_length"] == 0
    assert shown(None, None, method="none", speculating=False, draft_length=None)[
        "mean_accepted_length"] is None


async def test_status_api_and_metrics_show_the_same_numbers_for_the_same_counters():
    world = World()
    target = Target(name="t", backend="fake", model="m", port=1,
                    speculation={"method": "ngram", "length": {"start": 4}},
                    health={"interval": 0.01, "metrics_interval": 0.01})
    backend = FakeBackend(target)
    backend.world = world
    world.metrics = COUNTERS
    bus = EventBus()
    async with aiohttp.ClientSession() as http:
        sup = TargetSupervisor(target, backend, FakeLauncher(world), bus, http)
        sup.start_owner_task()
        async with asyncio.timeout(5):
            while sup.metrics is None:
                await asyncio.sleep(0.01)
        client = TestClient(TestServer(ApiServer(OneTargetFleet(sup, bus)).app))
        await client.start_server()
        try:
            api = (await (await client.get("/v1/targets")).json())["targets"][0]
            metrics_text = await (await client.get("/metrics")).text()
        finally:
            await client.close()
            await sup.shutdown("test over")
    scraped = {s.name: s.value for f in text_string_to_metric_families(metrics_text)
               for s in f.samples if s.labels.get("target") == "t"}
    table = statusview.render({"daemon": {}, "targets": [api]}, alive=False)

    assert api["shown"]["acceptance_rate"] == scraped["specfleet_target_acceptance_rate"] == 0.375
    assert api["shown"]["mean_accepted_length"] == \
        scraped["specfleet_target_mean_accepted_length"] == 2.5
    assert api["shown"]["tokens_per_second"] == \
        scraped["specfleet_target_tokens_per_second"] == 50.0
    assert api["shown"]["draft_length"] == scraped["specfleet_target_draft_length"] == 4
    assert "37.5% 2.50 tokens/step" in table and " 50.0 tok/s " in table and "ngram-mod n=4" in table
