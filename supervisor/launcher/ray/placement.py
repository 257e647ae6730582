"""Which Ray node a target runs on: pure logic over a snapshot of the cluster's nodes.

The fleet file names nodes in order of preference (`ray.nodes`); the first one alive
with the resources free is chosen. A node where an actor of ours just died (its raylet
killed, the machine gone) may still count as alive in Ray's books for a while (its
health checks take seconds to fail): it is tried last until then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Resources every node has, which say nothing about which node it is.
_BUILTIN = ("CPU", "GPU", "memory", "object_store_memory")
_BUILTIN_PREFIXES = ("node:", "accelerator_type:")


@dataclass(frozen=True)
class NodeView:
    node_id: str
    address: str
    hostname: str
    alive: bool
    total: Mapping[str, float] = field(default_factory=dict)
    available: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def custom_resources(self) -> list[str]:
        return sorted(k for k in self.total if k not in _BUILTIN
                      and not k.startswith(_BUILTIN_PREFIXES))

    def matches(self, name: str) -> bool:
        """Whether `name` (from the fleet file's `ray.nodes`) designates this node."""
        return (name in (self.hostname, self.address) or name in self.labels.values()
                or name in self.custom_resources()
                or (len(name) >= 8 and self.node_id.startswith(name)))

    def describe(self, name: str | None = None) -> str:
        """How events and status name the node: the fleet file's name for it, its address
        and the start of its id (several nodes of one machine share the address)."""
        label = name or (self.custom_resources() or [self.hostname])[0]
        return f"{label} ({self.address}, node {self.node_id[:8]})"


@dataclass(frozen=True)
class Choice:
    node: NodeView
    name: str  # the fleet file's name for it, or a name of the node's own


def nodes_from(table: Iterable[Mapping[str, Any]],
               available: Mapping[str, Mapping[str, float]],
               seen: dict[str, dict[str, float]] | None = None) -> list[NodeView]:
    """NodeViews from `ray.nodes()` and the per-node available resources.

    `seen` keeps each node's resources from when it was alive (updated here): Ray lists a
    dead node with no resources at all, and a node named by a custom resource (`ray.nodes:
    [box-b]`) would then match no name, so a target pinned to it would be told that no node
    matches its `ray.nodes` instead of that the node is gone."""
    seen = {} if seen is None else seen
    out = []
    for n in table:
        node_id, total = str(n["NodeID"]), dict(n.get("Resources") or {})
        if total:
            seen[node_id] = total
        out.append(NodeView(node_id=node_id, address=str(n.get("NodeManagerAddress", "")),
                            hostname=str(n.get("NodeManagerHostname", "")),
                            alive=bool(n.get("Alive")), total=total or seen.get(node_id, {}),
                            available=dict(available.get(node_id, {})),
                            labels={str(k): str(v) for k, v in (n.get("Labels") or {}).items()}))
    return out


def demand(num_gpus: int, num_cpus: float, resources: Mapping[str, float]) -> dict[str, float]:
    out = {k: float(v) for k, v in resources.items()}
    if num_gpus:
        out["GPU"] = float(num_gpus)
    if num_cpus:
        out["CPU"] = float(num_cpus)
    return out


def shortfall(node: NodeView, need: Mapping[str, float]) -> str | None:
    """What the node lacks for `need`, or None when it fits now."""
    for key, amount in sorted(need.items()):
        free = node.available.get(key, 0.0)
        if free < amount:
            total = node.total.get(key, 0.0)
            return f"{_amount(free)} of {_amount(total)} {key} free, {_amount(amount)} needed"
    return None


def _amount(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def candidates(nodes: Iterable[NodeView], preference: tuple[str, ...]) -> list[Choice]:
    """Nodes the target may use, in the fleet file's order (any node when it names none)."""
    nodes = list(nodes)
    if not preference:
        return [Choice(n, (n.custom_resources() or [n.hostname])[0]) for n in nodes]
    out, seen = [], set()
    for name in preference:
        for node in nodes:
            if node.node_id not in seen and node.matches(name):
                out.append(Choice(node, name))
                seen.add(node.node_id)
    return out


def choose(nodes: Iterable[NodeView], preference: tuple[str, ...], need: Mapping[str, float],
           suspect: frozenset[str] = frozenset()) -> Choice | str:
    """The node to start on, or why there is none (for the `failed` state's reason)."""
    options = candidates(nodes, preference)
    if not options:
        return ("no node of the Ray cluster matches ray.nodes "
                f"{list(preference)} (node names: hostname, address, node id, label or "
                "custom resource)")
    why = []
    for choice in options:
        if not choice.node.alive:
            why.append(f"{choice.node.describe(choice.name)} is gone")
        elif choice.node.node_id in suspect:
            # Ray's node table says alive for seconds after a node dies (until its health
            # checks fail): an actor placed there dies at once ("The actor died
            # unexpectedly"), so the node is passed over until Ray has made up its mind.
            why.append(f"{choice.node.describe(choice.name)} lost an actor of ours moments "
                       "ago (Ray may not know yet whether it is gone)")
        elif (lack := shortfall(choice.node, need)) is not None:
            why.append(f"{choice.node.describe(choice.name)} has {lack}")
        else:
            return choice
    return "no node fits: " + "; ".join(why)
