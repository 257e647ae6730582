"""docs/fleet-file.md is generated from the schema and documents every key of it.

(That every file in examples/ loads is tested by test_cli.py's
test_every_shipped_example_validates, through `specfleet check`.)
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from supervisor.config.loader import load_fleet
from supervisor.config.reference import REGENERATE, render
from supervisor.config.schema import Fleet, Target, TargetDefaults
from tests.conftest import REPO

DOC = REPO / "docs" / "fleet-file.md"


def _models_in(annotation: Any) -> Iterator[tuple[type[BaseModel], str]]:
    """Models inside an annotation, each with the path suffix to reach it: a mapping of
    named mappings (dict[str, Model]) adds `.<name>`. Written apart from the renderer."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, ""
    elif typing.get_origin(annotation) is dict:
        for model, _ in _models_in(typing.get_args(annotation)[1]):
            yield model, ".<name>"
    elif typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)


def _schema_keys(model: type[BaseModel], prefix: str = "",
                 descend: bool = True) -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted path, model that owns the key) for every key. Below the keys of defaults:
    nothing is walked: its mappings are the targets' (checked by the next tests)."""
    for key, field in model.model_fields.items():
        path = f"{prefix}{key}"
        yield path, model
        for nested, suffix in _models_in(field.annotation) if descend else ():
            yield from _schema_keys(nested, f"{path}{suffix}.", descend=path != "defaults")


def _all_models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    seen.add(model)
    for field in model.model_fields.values():
        for nested, _ in _models_in(field.annotation):
            if nested not in seen:
                _all_models(nested, seen)
    return seen


def _documented_keys(text: str) -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE))


def test_the_fleet_file_reference_is_exactly_what_the_renderer_writes():
    assert DOC.read_text() == render(), (
        f"docs/fleet-file.md is stale; regenerate it with `{REGENERATE}`")


def test_every_key_of_every_schema_model_is_in_the_reference_under_its_dotted_path():
    documented = _documented_keys(DOC.read_text())
    keys = dict(_schema_keys(Fleet))
    missing = sorted(set(keys) - documented)
    assert not missing, f"keys missing from docs/fleet-file.md: {missing}"
    assert documented == set(keys), f"documented keys the schema lacks: {documented - set(keys)}"
    # A model reachable only under defaults: would escape the walk above.
    assert _all_models(Fleet, set()) == set(keys.values())


def test_every_key_under_defaults_is_a_target_key_so_the_targets_tables_document_it():
    assert set(TargetDefaults.model_fields) <= set(Target.model_fields)


def test_the_reference_names_a_section_for_every_mapping_it_links_to():
    text = DOC.read_text()
    headings = {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^## (.+)$", text, re.MULTILINE)}
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links and links <= headings, f"links to no heading: {links - headings}"


def test_the_example_at_the_top_of_the_reference_is_a_valid_fleet_file(tmp_path: Path):
    example = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert example is not None
    (tmp_path / "fleet.yaml").write_text(example.group(1))
    loaded = load_fleet(tmp_path / "fleet.yaml", environ={})
    assert set(loaded.fleet.targets) == {"qwen3-8b", "gemma-ngram"}
    assert loaded.fleet.targets["gemma-ngram"].restart.window == 600  # from defaults:


def test_a_schema_key_without_a_description_stops_the_renderer():
    class Knobs(BaseModel):
        """A model with one undocumented key."""

        documented: int = Field(default=1, description="Has a meaning.")
        undocumented: Literal["a", "b"] = "a"

    with pytest.raises(ValueError, match=r"Knobs.undocumented .* has no description"):
        render(Knobs)
