"""Cosign-compatible signatures of a ModelKit's (or ModelPack's) manifest, and the trust
policy that asks for them (docs/modelkits.md, "Signed models").

Cosign keeps a signature of the manifest `sha256:<hex>` in the same repository, under the
tag `sha256-<hex>.sig`: an OCI image manifest whose layers are each a "simple signing"
payload (media type `application/vnd.dev.cosign.simplesigning.v1+json`) that names the
manifest digest it signs (`critical.image.docker-manifest-digest`), with the signature of
those payload bytes, base64, in the layer's annotation `dev.cosignproject.cosign/signature`.
A manifest is signed by a key when one such layer's payload names this digest and its
signature verifies with the key (ECDSA P-256 with SHA-256, cosign's default; Ed25519; RSA
PKCS#1 v1.5 with SHA-256). The cryptography is the `cryptography` package's.

Policies: `required` (no signature a trusted key made: refused), `if_present` (signatures
that are there must include one a trusted key made; none: accepted, said as unsigned),
`off` (not looked at). A refusal is `Untrusted`, naming the reference, the digest and the
keys tried: the target does not start, and a serving one is never replaced by it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from supervisor.config import ociref
from supervisor.errors import Untrusted

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
MAX_PAYLOAD = 64 * 1024  # a simple-signing payload is a few hundred bytes


def signature_tag(digest: str) -> str:
    """Where cosign keeps the signatures of the manifest `digest`."""
    return digest.replace(":", "-") + ".sig"


@dataclass(frozen=True)
class Signed:
    """One signature layer: its payload (verified against its digest) and signature."""

    payload: bytes
    signature: bytes


@dataclass(frozen=True)
class Verdict:
    """What the policy decided for one manifest."""

    policy: str
    signed_by: str | None = None  # the trusted key that verified a signature
    signatures: int = 0  # signature layers found for this digest
    tried: tuple[str, ...] = field(default_factory=tuple)

    def provenance(self) -> dict[str, object]:
        """What status and the run record say of it."""
        if self.policy == "off":
            return {"signature": "not checked (verify: off)"}
        if self.signed_by:
            return {"signature": "verified", "signed_by": self.signed_by}
        return {"signature": "unsigned (verify: if_present)"}


def load_keys(keys: Mapping[str, str]) -> dict[str, object]:
    """The public keys, by name, from their PEM files; a key that cannot be read refuses."""
    out: dict[str, object] = {}
    for name, path in keys.items():
        try:
            out[name] = serialization.load_pem_public_key(Path(path).expanduser().read_bytes())
        except (OSError, ValueError, TypeError) as exc:
            raise Untrusted(f"public key {name!r} ({path}) cannot be used: {exc}") from None
    return out


def verifies(key: object, signature: bytes, payload: bytes) -> bool:
    """Whether `signature` is `key`'s over `payload`."""
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, payload)
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, payload, padding.PKCS1v15(), hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


def signs(payload: bytes, digest: str) -> bool:
    """Whether a simple-signing payload names the manifest `digest`."""
    try:
        critical = json.loads(payload)["critical"]
        return bool(critical["image"]["docker-manifest-digest"] == digest)
    except (ValueError, KeyError, TypeError):
        return False


def signature_layers(manifest: bytes) -> list[tuple[str, bytes]]:
    """(payload digest, signature) of each simple-signing layer of a signature manifest."""
    try:
        layers = json.loads(manifest).get("layers") or []
    except ValueError:
        return []
    out = []
    for layer in layers:
        if not isinstance(layer, dict) or layer.get("mediaType") != SIMPLE_SIGNING:
            continue
        encoded = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
        try:
            out.append((str(layer["digest"]), base64.b64decode(str(encoded), validate=True)))
        except (KeyError, binascii.Error, ValueError):
            continue
    return out


def payload_ok(payload: bytes, digest: str) -> bool:
    return f"sha256:{hashlib.sha256(payload).hexdigest()}" == digest


def judge(policy: str, ref: ociref.Reference, digest: str, signed: list[Signed],
          keys: Mapping[str, object]) -> Verdict:
    """The policy's verdict on `digest`, from its signatures and the trusted keys (pure)."""
    tried = tuple(sorted(keys))
    if policy == "off":
        return Verdict(policy)
    mine = [s for s in signed if signs(s.payload, digest)]
    for name in tried:
        if any(verifies(keys[name], s.signature, s.payload) for s in mine):
            return Verdict(policy, name, len(mine), tried)
    if not mine and policy == "if_present":
        return Verdict(policy, None, 0, tried)
    said = (f"{len(mine)} signature(s), none made by a trusted key" if mine else
            "no signature (cosign's " + signature_tag(digest) + " is not in the registry)")
    raise Untrusted(f"{ref} ({digest}) is not trusted: {said}; keys tried: "
                    f"{', '.join(tried) or 'none (set daemon.modelkits.keys)'} "
                    f"(verify: {policy})")
