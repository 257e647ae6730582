"""A calibration beside a server gives way to the work of every server on its device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from supervisor.plugin.backend import MetricsSample
from supervisor.supervision.neighbours import shares_device, work_beside
from supervisor.supervision.requests import ProxyRequests


@dataclass
class Owner:  # the parts of a target's owner the mark reads
    placement: dict[str, Any] = field(default_factory=dict)
    serving: bool = True
    requests: ProxyRequests = field(default_factory=ProxyRequests)
    metrics: MetricsSample | None = None


def test_cpu_targets_share_the_cores_and_gpu_targets_share_a_gpu():
    assert shares_device({}, {"gpus": []})
    assert shares_device({"gpus": [0, 1]}, {"gpus": [1]})
    assert not shares_device({"gpus": [0]}, {"gpus": [1]})
    assert not shares_device({"gpus": [0]}, {})  # one on a GPU, one on the CPU
    assert not shares_device({"node": "a"}, {"node": "b"})  # Ray: other machines
    assert shares_device({"node": "a", "gpus": [0]}, {"node": "a", "gpus": [0]})


async def test_the_mark_moves_when_a_neighbour_on_the_same_device_works():
    me, cpu, gpu = Owner(), Owner(), Owner(placement={"gpus": [0]})
    fleet = [me, cpu, gpu]
    mark = work_beside(me, lambda: fleet)
    assert work_beside(me, lambda: fleet) == mark  # nothing worked
    gpu.metrics = MetricsSample(tokens_predicted=50)  # another device's work: no matter
    assert work_beside(me, lambda: fleet) == mark
    cpu.metrics = MetricsSample(tokens_predicted=50)  # a neighbour's request, seen at a scrape
    assert work_beside(me, lambda: fleet) != mark
    mark = work_beside(me, lambda: fleet)
    async with cpu.requests.relaying():  # one in flight through the proxy: never equal
        assert work_beside(me, lambda: fleet) != work_beside(me, lambda: fleet)
    assert work_beside(me, lambda: fleet) != mark  # it ended since
    mark = work_beside(me, lambda: fleet)
    cpu.serving = False  # it stopped (or starts: loading is work too)
    assert work_beside(me, lambda: fleet) != mark


async def test_its_own_servers_work_moves_the_mark_with_no_neighbours():
    me = Owner()
    mark = work_beside(me, tuple)
    me.metrics = MetricsSample(requests_processing=1)
    assert work_beside(me, tuple) != work_beside(me, tuple)
    me.metrics = MetricsSample(tokens_predicted=10)
    assert work_beside(me, tuple) != mark
