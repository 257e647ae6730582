"""Signed ModelKits (supervisor/registry/signatures.py): signatures in cosign's layout on a
real registry (Debian's docker-registry on loopback), keys this test generates, and the
trust policy of each target: required, if_present, off. A refusal names the reference,
the digest and the keys tried; the cache keeps what was verified for a start while the
registry is down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from supervisor.config.schema import ModelKit, Target
from supervisor.errors import Untrusted
from supervisor.registry.modelkits import ModelKits
from supervisor.registry.store import LayerStore
from tests.oci_registry import cosign_sign, public_pem
from tests.supervision.test_pulling import push


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as http:
        yield http


def kits_with(tmp_path: Path, session: aiohttp.ClientSession, **keys: str) -> ModelKits:
    return ModelKits(LayerStore(tmp_path / "cache"), session, timeout=5, keys=keys)


async def test_each_policy_on_signed_unsigned_and_wrongly_signed_kits(
        tmp_path, session, oci_registry):
    ops, stranger = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    kits = kits_with(tmp_path, session, ops=public_pem(ops, tmp_path / "ops.pub"))
    ref = f"{oci_registry.host}/lab/pair"

    digest = push(oci_registry, "signed")
    cosign_sign(oci_registry, "lab/pair", digest, ops)
    resolved = await kits.resolve(f"{ref}:signed")
    verdict = await kits.verify(resolved, "required", kits.keys)
    assert verdict.signed_by == "ops"
    assert verdict.provenance() == {"signature": "verified", "signed_by": "ops"}

    push(oci_registry, "unsigned", b"GGUF other model")
    unsigned = await kits.resolve(f"{ref}:unsigned")
    with pytest.raises(Untrusted) as refused:
        await kits.verify(unsigned, "required", kits.keys)
    said = str(refused.value)
    assert f"{ref}:unsigned" in said and unsigned.digest in said
    assert "no signature" in said and "keys tried: ops" in said
    assert (await kits.verify(unsigned, "if_present", kits.keys)).signed_by is None
    assert (await kits.verify(unsigned, "off", kits.keys)).policy == "off"

    wrong_digest = push(oci_registry, "stranger", b"GGUF a third model")
    cosign_sign(oci_registry, "lab/pair", wrong_digest, stranger)
    wrong = await kits.resolve(f"{ref}:stranger")
    for policy in ("required", "if_present"):  # a signature that is there must be trusted
        with pytest.raises(Untrusted, match=r"1 signature\(s\), none made by a trusted key"):
            await kits.verify(wrong, policy, kits.keys)


async def test_a_tampered_payload_or_signature_is_refused(tmp_path, session, oci_registry):
    ops = ed25519.Ed25519PrivateKey.generate()
    kits = kits_with(tmp_path, session, ops=public_pem(ops, tmp_path / "ops.pub"))
    digest = push(oci_registry, "v1")
    cosign_sign(oci_registry, "lab/pair", digest, ops, tamper=True)
    resolved = await kits.resolve(f"{oci_registry.host}/lab/pair:v1")
    with pytest.raises(Untrusted, match=r"none made by a trusted key|no signature"):
        await kits.verify(resolved, "required", kits.keys)


async def test_what_was_verified_is_judged_again_from_the_cache_while_the_registry_is_down(
        tmp_path, session, oci_registry):
    ops = ec.generate_private_key(ec.SECP256R1())
    kits = kits_with(tmp_path, session, ops=public_pem(ops, tmp_path / "ops.pub"))
    digest = push(oci_registry, "v1")
    cosign_sign(oci_registry, "lab/pair", digest, ops)
    ref = f"{oci_registry.host}/lab/pair:v1"
    resolved = await kits.resolve(ref)
    await kits.verify(resolved, "required", kits.keys)
    target = Target(name="t", model="", port=1, modelkit=ref)
    await kits.pull(resolved, resolved.layers(target))  # as a start does: the tag remembered
    oci_registry.stop()
    offline = await kits.resolve(ref)
    assert offline.offline  # from the cache
    assert (await kits.verify(offline, "required", kits.keys)).signed_by == "ops"


def test_a_target_trusts_the_daemons_keys_and_its_own_under_its_own_policy(tmp_path):
    kits = ModelKits(LayerStore(tmp_path), None, keys={"ops": "/ops.pub"},  # type: ignore[arg-type]
                     verify="if_present")
    assert kits.trust_of(ModelKit(ref="h:5000/r:t")) == ("if_present", {"ops": "/ops.pub"})
    assert kits.trust_of(ModelKit(ref="h:5000/r:t", verify="required",
                                  keys={"vendor": "/v.pub"})) == (
        "required", {"ops": "/ops.pub", "vendor": "/v.pub"})


def test_a_key_that_is_not_a_public_key_refuses(tmp_path):
    from supervisor.registry.signatures import load_keys

    bad = tmp_path / "bad.pub"
    bad.write_text("not a key")
    with pytest.raises(Untrusted, match=r"public key 'ops' .* cannot be used"):
        load_keys({"ops": str(bad)})


async def test_a_target_runs_a_signed_kit_and_a_reload_to_an_unsigned_one_leaves_it_serving(
        tmp_path, session, oci_registry, start_target):
    """The owner in-process (tests/supervision/conftest.py), the registry real: `required`
    starts the signed kit and says who signed it; the tag moved to an unsigned kit and the
    target reloaded: not applied, the server that serves goes on; an unsigned kit from the
    start: the target fails, saying why."""
    from supervisor.supervision.states import State as S

    ops = ec.generate_private_key(ec.SECP256R1())
    kits = kits_with(tmp_path, session, ops=public_pem(ops, tmp_path / "ops.pub"))
    kits.policy = "required"
    ref = f"{oci_registry.host}/lab/pair:v1"
    cosign_sign(oci_registry, "lab/pair", push(oci_registry, "v1"), ops)
    run = start_target(kits=kits, model="", modelkit=ref, beside=True)
    await run.reaches(S.READY)
    kit = run.sup.status().modelkit
    assert kit["signature"] == "verified" and kit["signed_by"] == "ops"
    serving = run.process

    push(oci_registry, "v1", b"GGUF a model nobody signed")  # the tag moves
    sup = run.sup
    target = sup.target.model_copy(update={"model": ""})
    sup.redefine(sup.define(target, sup.home.with_target(target), sup.launcher),
                 "changed in fleet.yaml (reload)")
    await run.until(lambda: any(e.data.get("replace") == "refused" for e in run.events))
    said = next(e.reason for e in run.events if e.data.get("replace") == "refused")
    assert "not applied, the running server" in said and "is not trusted" in said
    assert run.process is serving and serving.returncode is None and sup.state is S.READY

    unsigned = start_target(kits=kits, model="", modelkit=f"{oci_registry.host}/lab/pair:v1")
    await unsigned.reaches(S.FAILED)
    assert "is not trusted: no signature" in unsigned.events[-1].reason
    assert unsigned.world.starts == []
