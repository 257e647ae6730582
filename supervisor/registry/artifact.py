"""What a ModelKit or a ModelPack holds, read from its manifest and config (no blob yet).

KitOps (docs/modelkit-formats.md §1): an OCI image manifest whose config is the Kitfile as
JSON (`application/vnd.kitops.modelkit.config.v1+json`; newer Kit also sets `artifactType`);
one layer per Kitfile entry, in the Kitfile's order within each type (model, model.parts,
code, datasets, docs), each a tar of the entry's path, relative to the Kitfile's directory.
`kit unpack` maps layers to entries by that order; so does this. ModelPack (§4): artifact
type `application/vnd.cncf.model.manifest.v1+json`, weight layers (tar or raw) whose path
is the `org.cncf.model.filepath` annotation, or the Kitfile in the manifest annotation
`ml.kitops.modelkit.kitfile` where KitOps wrote it.

The target is the Kitfile's `model` (ModelPack without a Kitfile: the largest GGUF weight);
the draft is a GGUF part chosen by name, or the only one. Pure: bytes in, Artifact out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from supervisor.errors import SpecfleetError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
KIT_CONFIG = "application/vnd.kitops.modelkit.config.v1+json"
KIT_MANIFEST = "application/vnd.kitops.modelkit.manifest.v1+json"
KIT_INDEX = "application/vnd.kitops.modelkit.index.v1+json"
MODELPACK_MANIFEST = "application/vnd.cncf.model.manifest.v1+json"
MODELPACK_CONFIG = "application/vnd.cncf.model.config.v1+json"
KITFILE_ANNOTATION = "ml.kitops.modelkit.kitfile"
FILEPATH_ANNOTATION = "org.cncf.model.filepath"
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX))

_KIT_LAYER = re.compile(r"^application/vnd\.kitops\.modelkit\.(\w+)\.v1\.(tar|raw)(?:\+(\w+))?$")
_PACK_LAYER = re.compile(r"^application/vnd\.cncf\.model\.([\w.]+)\.v1\.(tar|raw)(?:\+(\w+))?$")
COMPRESSIONS = ("gzip", "zstd")


class ArtifactError(SpecfleetError):
    pass


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int
    media_type: str
    kind: str  # model, modelpart, code, dataset, docs (Kit); weight, doc, ... (ModelPack)
    archive: str  # "tar" or "raw"
    compression: str | None  # None, "gzip", "zstd"
    path: str  # the file or directory it holds, relative to the artifact's root
    name: str = ""  # a model part's name in the Kitfile

    @property
    def gguf(self) -> bool:
        return self.path.lower().endswith(".gguf")


@dataclass(frozen=True)
class Artifact:
    format: str  # "kit" or "modelpack"
    layers: tuple[Layer, ...]
    kitfile: dict[str, Any] = field(default_factory=dict)

    @property
    def package(self) -> dict[str, str]:
        """The Kitfile's package name and version (provenance), where it has them."""
        package = self.kitfile.get("package") or {}
        return {k: str(package[k]) for k in ("name", "version") if package.get(k)}

    def model(self) -> Layer:
        """The target's weights: the Kitfile's `model`, else the largest GGUF weight."""
        for layer in self.layers:
            if layer.kind == "model":
                if not layer.gguf:
                    raise ArtifactError(f"the ModelKit's model is {layer.path!r}, not a GGUF file "
                                        "(specfleet serves GGUF models from ModelKits)")
                return layer
        weights = [x for x in self.layers if x.kind == "weight" and x.gguf]
        if not weights:
            raise ArtifactError("the artifact has no model: no Kitfile `model` layer and no "
                                "GGUF weight layer")
        return max(weights, key=lambda x: x.size)

    def draft(self, name: str | None = None) -> Layer:
        """The draft: the GGUF part called `name` (its Kitfile name or file name), or the only
        GGUF part besides the model."""
        target = self.model()
        parts = [x for x in self.layers if x.gguf and x is not target
                 and x.kind in ("modelpart", "weight")]
        if name is not None:
            for part in parts:
                if name in (part.name, part.path, part.path.rsplit("/", 1)[-1]):
                    return part
            raise ArtifactError(f"no GGUF part called {name!r}; parts: "
                                f"{_names(parts) or '(none)'}")
        if len(parts) != 1:
            raise ArtifactError(
                "no GGUF part to draft with" if not parts else
                f"{len(parts)} GGUF parts ({_names(parts)}): name the draft (modelkit.draft)")
        return parts[0]


def _names(parts: list[Layer]) -> str:
    return ", ".join(p.name or p.path for p in parts)


def parse_json(raw: bytes, what: str) -> dict[str, Any]:
    """`raw` as a JSON object, or ArtifactError naming `what` it should have been."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ArtifactError(f"the {what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ArtifactError(f"the {what} is not a JSON object")
    return value


def manifest_format(manifest: dict[str, Any]) -> str:
    """"kit", "modelpack", or ArtifactError for anything else (an image, an index)."""
    config = (manifest.get("config") or {}).get("mediaType")
    kind = manifest.get("artifactType")
    if manifest.get("mediaType") == OCI_INDEX or "manifests" in manifest:
        raise ArtifactError("the reference names an index of several manifests (a ModelKit "
                            "index or a multi-platform image): name one manifest by its digest")
    if kind == KIT_MANIFEST or config == KIT_CONFIG:
        return "kit"
    if kind == MODELPACK_MANIFEST or config == MODELPACK_CONFIG:
        return "modelpack"
    raise ArtifactError(f"not a ModelKit or a ModelPack (artifactType {kind!r}, config "
                        f"{config!r}): a container image, perhaps")


def read(manifest_raw: bytes, config_raw: bytes | None) -> Artifact:
    """The artifact a manifest describes; `config_raw` is the config blob (the Kitfile as
    JSON for a ModelKit; a ModelPack's config is not needed)."""
    manifest = parse_json(manifest_raw, "manifest")
    fmt = manifest_format(manifest)
    descriptors = manifest.get("layers") or []
    if fmt == "kit":
        kitfile = parse_json(config_raw or b"", "Kitfile (the ModelKit's config)")
    else:
        text = (manifest.get("annotations") or {}).get(KITFILE_ANNOTATION)
        kitfile = parse_json(text.encode(), "Kitfile annotation") if text else {}
    layers = _kit_layers(descriptors, kitfile) if fmt == "kit" else \
        _pack_layers(descriptors, kitfile)
    return Artifact(fmt, tuple(layers), kitfile)


def _entries(kitfile: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The Kitfile's entries by layer kind, in pack order."""
    model = kitfile.get("model") or {}
    return {"model": [model] if model else [], "modelpart": list(model.get("parts") or []),
            "code": list(kitfile.get("code") or []) + list(kitfile.get("prompts") or []),
            "dataset": list(kitfile.get("datasets") or []), "docs": list(kitfile.get("docs") or [])}


def _kit_layers(descriptors: list[Any], kitfile: dict[str, Any]) -> list[Layer]:
    entries, used = _entries(kitfile), {k: 0 for k in ("model", "modelpart", "code", "dataset",
                                                        "docs")}
    layers = []
    for d in descriptors:
        found = _KIT_LAYER.match(str(d.get("mediaType", "")))
        if found is None or found[1] not in used:
            continue  # a kind this version does not know (mcpb, ...): not needed to serve
        kind, archive, compression = found[1], found[2], found[3]
        listed = entries[kind]
        entry = listed[used[kind]] if used[kind] < len(listed) else {}
        used[kind] += 1
        if entry.get("digest") and entry["digest"] != d.get("digest"):
            raise ArtifactError(f"the Kitfile's {kind} {entry.get('path')!r} has digest "
                                f"{entry['digest']}, the manifest's layer {d.get('digest')}")
        path = (d.get("annotations") or {}).get(FILEPATH_ANNOTATION) or entry.get("path", "")
        layers.append(_layer(d, kind, archive, compression, path, str(entry.get("name") or "")))
    return layers


def _pack_layers(descriptors: list[Any], kitfile: dict[str, Any]) -> list[Layer]:
    named = {str(p.get("path")): str(p.get("name") or "")
             for p in _entries(kitfile)["modelpart"]}
    model_path = str((kitfile.get("model") or {}).get("path") or "")
    layers = []
    for d in descriptors:
        found = _PACK_LAYER.match(str(d.get("mediaType", "")))
        if found is None:
            continue
        path = (d.get("annotations") or {}).get(FILEPATH_ANNOTATION) or ""
        kind = "model" if model_path and path == model_path else found[1]
        layers.append(_layer(d, kind, found[2], found[3], path, named.get(path, "")))
    return layers


def _layer(d: dict[str, Any], kind: str, archive: str, compression: str | None, path: str,
           name: str) -> Layer:
    digest, size = d.get("digest"), d.get("size")
    if not isinstance(digest, str) or not re.match(r"^sha256:[0-9a-f]{64}$", digest):
        raise ArtifactError(f"a {kind} layer has no sha256 digest ({digest!r})")
    if not isinstance(size, int) or size < 0:
        raise ArtifactError(f"the {kind} layer {digest} has no size")
    if compression is not None and compression not in COMPRESSIONS:
        raise ArtifactError(f"the {kind} layer {digest} is compressed with {compression!r}; "
                            f"known: {', '.join(COMPRESSIONS)}")
    if not path or path.startswith("/") or ".." in path.split("/"):
        raise ArtifactError(f"the {kind} layer {digest} has no usable path ({path!r})")
    return Layer(digest, size, d["mediaType"], kind, archive, compression, path, name)
