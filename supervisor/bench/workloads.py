"""Workload classes shipped for `specfleet bench`: each a few prompts and its sampling.

Acceptance depends on the workload far more than on anything else: output that
repeats its input (code edits, JSON extraction) accepts most drafts; free prose
sampled at temperature 0.8 with a repetition penalty accepts few. The prompts are
written for small base models (no chat template needed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.errors import SpecfleetError


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: tuple[str, ...]
    sampling: dict[str, Any] = field(default_factory=dict)
    # Names renamed in each request by `prompt` (for code: its identifiers).
    renamed: tuple[str, ...] = ()

    def prompt(self, i: int) -> str:
        """Request i's prompt: the prompts in turn, with `renamed` given a suffix of i's own,
        so that no two requests are the same text and a drafter that learns across requests
        (llama.cpp's ngram-mod pool) cannot draft one answer from an earlier one; what it
        can draft is what the request itself repeats, as in real code edits."""
        base = self.prompts[i % len(self.prompts)]
        if not self.renamed:
            return base
        tag = _tag(i)
        pattern = r"\b(" + "|".join(map(re.escape, self.renamed)) + r")\b"
        return re.sub(pattern, lambda m: f"{m.group(1)}_{tag}", base)


def _tag(i: int) -> str:
    """A short name of letters for i, different for every i ("ba", "bb", ...)."""
    letters, n = "", i + 26
    while n:
        n, r = divmod(n, 26)
        letters = "abcdefghijklmnopqrstuvwxyz"[r] + letters
    return letters


_CODE = (
    "def parse_line(line):\n    key, _, value = line.partition('=')\n    return key.strip(), "
    "value.strip()\n\ndef parse_file(path):\n    with open(path) as f:\n        return dict("
    "parse_line(l) for l in f if '=' in l)\n\n# The same two functions, copied exactly:\n"
    "def parse_line(line):\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __add__(self, other):\n        return Point(self.x + other.x, self.y + other.y)\n\n"
    "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n\n"
    "# Same class again, unchanged:\nclass Point:\n",
    "SELECT id, name, email FROM users WHERE active = 1 ORDER BY name;\n"
    "SELECT id, total, created FROM orders WHERE user_id = 7 ORDER BY created;\n"
    "SELECT id, name, email FROM users WHERE active = 1 ORDER BY name;\n"
    "SELECT id, total, created FROM orders WHERE user_id = 7 ORDER BY created;\n"
    "SELECT id, name, email FROM users WHERE active = 1 ORDER BY name;\n",
)

_CODE_NAMES = ("parse_line", "parse_file", "key", "value", "line", "path", "Point", "other",
               "users", "orders", "email", "total", "created", "user_id")

_JSON = (
    "Text: Maria Lopez, 34, lives in Valencia and works as a nurse.\n"
    'JSON: {"name": "Maria Lopez", "age": 34, "city": "Valencia", "job": "nurse"}\n'
    "Text: Tom Becker, 51, lives in Hamburg and works as a pilot.\n"
    'JSON: {"name": "Tom Becker", "age": 51, "city": "Hamburg", "job": "pilot"}\n'
    "Text: Aiko Tanaka, 28, lives in Osaka and works as an architect.\nJSON:",
    "Order 1042: 3 x blue mug at 7.50, shipped to Lyon.\n"
    '{"order": 1042, "qty": 3, "item": "blue mug", "price": 7.50, "city": "Lyon"}\n'
    "Order 1043: 1 x red lamp at 24.00, shipped to Turin.\n"
    '{"order": 1043, "qty": 1, "item": "red lamp", "price": 24.00, "city": "Turin"}\n'
    "Order 1044: 2 x green chair at 55.00, shipped to Porto.\n",
    "Server web-01 is up, cpu 12%, memory 40%.\n"
    '{"host": "web-01", "up": true, "cpu": 12, "memory": 40}\n'
    "Server web-02 is down, cpu 0%, memory 0%.\n"
    '{"host": "web-02", "up": false, "cpu": 0, "memory": 0}\n'
    "Server db-01 is up, cpu 63%, memory 81%.\n",
)

_PROSE = (
    "Write a short story about a lighthouse keeper who finds a letter in a bottle.\n\n",
    "The old market town woke slowly that morning. ",
    "Describe, in your own words, what autumn feels like in a city park.\n\n",
)

BUILT_IN: dict[str, Workload] = {
    "code": Workload("code", _CODE, {"temperature": 0.0}, _CODE_NAMES),
    "json": Workload("json", _JSON, {"temperature": 0.0}),
    # Anti-repetition sampling: without it, small models loop and n-gram drafts look great.
    # No fixed seed: ngram-mod keeps its n-gram pool across requests, so a repeated seed
    # would replay the same text and be drafted perfectly from the previous request.
    "prose": Workload("prose", _PROSE, {"temperature": 0.8, "top_p": 0.95,
                                        "repeat_penalty": 1.3}),
}


def load_user_prompts(path: Path) -> list[Workload]:
    """JSON lines ({"class": ..., "prompt": ..., optional sampling keys}) or plain text
    (prompts separated by blank lines, class "user", temperature 0)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecfleetError(f"cannot read prompts file {path}: {exc.strerror}") from exc
    classes: dict[str, list[str]] = {}
    sampling: dict[str, dict[str, Any]] = {}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and all(ln.lstrip().startswith("{") for ln in lines):
        for n, line in enumerate(lines, 1):
            try:
                item = json.loads(line)
                name, prompt = str(item.pop("class", "user")), str(item.pop("prompt"))
            except (ValueError, KeyError) as exc:
                raise SpecfleetError(f"{path}:{n}: expected a JSON object with a \"prompt\" "
                                     f"(and optionally \"class\" and sampling keys): {exc}") from exc
            classes.setdefault(name, []).append(prompt)
            sampling.setdefault(name, {"temperature": 0.0, **item})
    else:
        prompts = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
        classes["user"] = prompts
        sampling["user"] = {"temperature": 0.0}
    if not classes:
        raise SpecfleetError(f"{path}: no prompts found")
    return [Workload(name, tuple(p), sampling[name]) for name, p in classes.items()]
