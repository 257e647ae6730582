"""Checks that span fields or targets; pure functions of a validated Fleet, except
check_api_token, which looks at this host (run with the backend checks)."""

from __future__ import annotations

from supervisor.config.schema import (
    METHODS_NEEDING_DRAFT,
    METHODS_WITH_DRAFT_FILE,
    METHODS_WITHOUT_MODEL,
    Fleet,
    Target,
)
from supervisor.config.yamlsource import Problem
from supervisor.errors import SpecfleetError

_WILDCARDS = {"0.0.0.0", "::", "", "*"}


def _hosts_overlap(a: str, b: str) -> bool:
    return a == b or a in _WILDCARDS or b in _WILDCARDS or {a, b} <= {"127.0.0.1", "localhost"}


def check_speculation(target: Target) -> list[Problem]:
    spec, base = target.speculation, ("targets", target.name, "speculation")
    problems: list[Problem] = []
    if spec.method == "none" and spec.draft:
        problems.append(Problem((*base, "draft"),
            f"a draft file is set but method is none; set method: draft "
            f"(or {', '.join(m for m in METHODS_WITH_DRAFT_FILE if m != 'draft')}) or remove draft"))
    if spec.method in METHODS_NEEDING_DRAFT and not spec.draft and target.modelkit is None:
        problems.append(Problem((*base, "method"),
            f"method {spec.method} needs a draft file; add draft: /path/to/draft.gguf"))
    if spec.method in METHODS_WITHOUT_MODEL and spec.draft:
        problems.append(Problem((*base, "draft"),
            f"{spec.method} speculation drafts from the context and takes no draft file; "
            "remove draft"))
    if spec.variant is not None and spec.method != "ngram":
        problems.append(Problem((*base, "variant"),
            f"variant applies to method ngram only (method is {spec.method}); remove variant"))
    if spec.variants is not None and spec.method != "ngram":
        problems.append(Problem((*base, "variants"),
            f"variants applies to method ngram only (method is {spec.method}); remove variants"))
    elif isinstance(spec.variants, tuple) and spec.variant is not None \
            and spec.variant not in spec.variants:
        problems.append(Problem((*base, "variants"),
            f"variants {list(spec.variants)} does not include variant {spec.variant!r}, the one "
            "it starts with; add it"))
    length = spec.length
    if length.max is not None and length.min > length.max:
        problems.append(Problem((*base, "length", "min"),
            f"min ({length.min}) is greater than max ({length.max})"))
    if length.start is not None:
        if length.start < length.min:
            problems.append(Problem((*base, "length", "start"),
                f"start ({length.start}) is below min ({length.min})"))
        if length.max is not None and length.start > length.max:
            problems.append(Problem((*base, "length", "start"),
                f"start ({length.start}) is above max ({length.max})"))
    return problems


def check_restart_and_health(target: Target) -> list[Problem]:
    problems = []
    r = target.restart
    if r.backoff_initial > r.backoff_max:
        problems.append(Problem(("targets", target.name, "restart", "backoff_initial"),
            f"backoff_initial ({r.backoff_initial:g}s) is longer than backoff_max "
            f"({r.backoff_max:g}s)"))
    if target.health.interval <= 0:
        problems.append(Problem(("targets", target.name, "health", "interval"),
                                "interval must be longer than 0s"))
    return problems


_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def check_daemon_listeners(fleet: Fleet) -> list[Problem]:
    """The API and the proxy need a token beyond loopback: they can restart targets and
    reach every model."""
    d = fleet.daemon
    problems = []
    listeners = [(("daemon", "api"), d.api)] + (
        [(("daemon", "proxy", "listen"), d.proxy.listen)] if d.proxy.enabled else [])
    for path, address in listeners:
        host = address.rpartition(":")[0]
        if host not in _LOOPBACK and d.api_token is None and not d.keys:
            problems.append(Problem(path, f"{address} is reachable beyond this machine, but "
                                    "daemon.api_token is not set: anyone could restart targets "
                                    "and use the models. Set api_token: {env: VAR} (or "
                                    "daemon.keys) or bind 127.0.0.1"))
    if d.proxy.enabled and d.proxy.listen.rpartition(":")[2] == d.api.rpartition(":")[2] and \
            _hosts_overlap(d.proxy.listen.rpartition(":")[0], d.api.rpartition(":")[0]):
        problems.append(Problem(("daemon", "proxy", "listen"),
                                f"{d.proxy.listen} is the API's address (daemon.api)"))
    return problems


def check_ports(fleet: Fleet) -> list[Problem]:
    problems = check_daemon_listeners(fleet)
    seen: list[tuple[str, int, str]] = []
    api_host, _, api_port = fleet.daemon.api.rpartition(":")
    proxy_host, _, proxy_port = fleet.daemon.proxy.listen.rpartition(":")
    for name, target in fleet.targets.items():
        for other_host, other_port, other in seen:
            if other_port == target.port and _hosts_overlap(other_host, target.host):
                problems.append(Problem(("targets", name, "port"),
                    f"port {target.port} is already used by target '{other}' "
                    f"(targets.{other}.port); every target needs its own port"))
                break
        if int(api_port) == target.port and _hosts_overlap(api_host, target.host):
            problems.append(Problem(("targets", name, "port"),
                f"port {target.port} is the daemon's API port (daemon.api: {fleet.daemon.api})"))
        if fleet.daemon.proxy.enabled and int(proxy_port) == target.port and \
                _hosts_overlap(proxy_host, target.host):
            problems.append(Problem(("targets", name, "port"),
                f"port {target.port} is the proxy's port (daemon.proxy.listen: "
                f"{fleet.daemon.proxy.listen})"))
        seen.append((target.host, target.port, name))
    return problems


def check_api_token(fleet: Fleet) -> list[Problem]:
    """`specfleet run` refuses a daemon.api_token or a key of daemon.keys that it cannot
    read, or an empty one (daemon/lifecycle.py), so `check` reports it too; and two keys
    that hold the same secret (which one a request used could not be told). Only that each
    can be read now: the daemon reads them again on every request, so a rotated key file
    needs no restart."""
    sources = [(("daemon", "api_token"), fleet.daemon.api_token)] + [
        (("daemon", "keys", name), key) for name, key in fleet.daemon.keys.items()]
    problems, seen = [], {}
    for where, source in sources:
        if source is None:
            continue
        path = (*where, "env" if source.env is not None else "file")
        refused = "; `specfleet run` refuses to start without it (the API and the proxy " \
                  "would refuse every request made with it)"
        try:
            secret = source.read(".".join(where))
        except SpecfleetError as exc:
            cause = exc.__cause__
            why = (f"environment variable {source.env} is not set" if source.env is not None
                   else f"cannot read {source.file!r}: "
                   f"{getattr(cause, 'strerror', None) or cause or exc}")
            problems.append(Problem(path, why + refused))
            continue
        if not secret:
            problems.append(Problem(path, ("the key is empty" if source.env is None else
                                           f"environment variable {source.env} is empty")
                                    + refused))
        elif secret in seen:
            problems.append(Problem(path, f"holds the same key as {'.'.join(seen[secret])}: "
                                    "give each key its own secret (its name is what the logs "
                                    "say of it)"))
        else:
            seen[secret] = where
    return problems


def check_keys(fleet: Fleet) -> list[Problem]:
    """What daemon.keys says, apart from this host: the targets a key names exist, and only
    an inference key names targets."""
    problems = []
    for name, key in fleet.daemon.keys.items():
        where = ("daemon", "keys", name)
        if name == "api_token":
            problems.append(Problem(where, "api_token is the name of daemon.api_token in the "
                                    "logs; give this key another name"))
        if key.targets is None:
            continue
        if "inference" not in key.scopes:
            problems.append(Problem((*where, "targets"), "targets: limits the inference scope, "
                                    "which this key does not have"))
        for i, target in enumerate(key.targets):
            if target not in fleet.targets:
                problems.append(Problem((*where, "targets", i), f"no target {target!r} in the "
                                        f"fleet; targets: {', '.join(fleet.targets)}"))
    return problems


def check_loading(target: Target) -> list[Problem]:
    """On-demand keys that cannot do what they say (docs/on-demand.md)."""
    base = ("targets", target.name)
    if target.group is not None and not target.evictable:
        return [Problem((*base, "evictable"), f"a member of group {target.group!r} is "
                        "unloaded whenever another member loads; evictable: false contradicts "
                        "that: remove one of them")]
    if target.idle_unload == 0:
        return [Problem((*base, "idle_unload"), "0 would unload the target as soon as it is "
                        "loaded; use a duration such as 10m, or remove idle_unload")]
    return []


def check_model_source(target: Target) -> list[Problem]:
    """`model` or `modelkit`, one of them; a draft part only where one is used."""
    base, kit, spec = ("targets", target.name), target.modelkit, target.speculation
    if kit is None:
        return [] if target.model else [Problem((*base, "model"), (
            "no model: add model: /path/to/model.gguf (or modelkit: HOST/REPOSITORY:TAG)"))]
    if target.model:
        return [Problem((*base, "modelkit"), "both model and modelkit name the model; "
                        "remove one of them")]
    if kit.draft and (spec.method not in METHODS_WITH_DRAFT_FILE or spec.draft):
        why = ("speculation.draft names a file already" if spec.draft
               else f"speculation method {spec.method} takes no draft file")
        return [Problem((*base, "modelkit", "draft"), f"a draft part is named but {why}; "
                        "remove one of them")]
    return []


def cross_check(fleet: Fleet) -> list[Problem]:
    problems = check_ports(fleet) + check_keys(fleet)
    for target in fleet.targets.values():
        problems += check_model_source(target)
        problems += check_speculation(target)
        problems += check_restart_and_health(target)
        problems += check_loading(target)
    if not fleet.targets:
        problems.append(Problem(("targets",), "no targets are defined; the daemon will idle",
                                "warning"))
    return problems
