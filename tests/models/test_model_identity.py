"""The one file identity behind the header, digest, --help and tuning-baseline caches."""

from __future__ import annotations

import os
import time

from supervisor.models import facts as modelfacts
from supervisor.models.identity import FileIdentity, file_identity
from supervisor.supervision.runrecord import RunRecorder
from tests.ggufs import write_model

# Timestamps move in kernel clock ticks (up to 10 ms on coarse-clock filesystems):
# two writes within one tick can share an mtime, so the tests let a tick pass.
TICK = 0.05


def rewrite(path, data: bytes) -> None:
    time.sleep(TICK)
    with open(path, "r+b") as f:  # in place: same inode, no truncation to a new file
        f.write(data)


def test_a_file_rewritten_in_place_with_the_same_size_gets_a_new_key(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 100)
    before = file_identity(model)
    rewrite(model, b"b" * 100)
    after = file_identity(model)
    assert (after.inode, after.size) == (before.inode, before.size)
    assert after != before and str(after) != str(before)


def test_a_rewrite_that_puts_the_old_mtime_back_still_gets_a_new_key(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 100)
    before = file_identity(model)
    rewrite(model, b"b" * 100)
    os.utime(model, ns=(before.mtime_ns, before.mtime_ns))  # what `cp -p` or `rsync -t` do
    after = file_identity(model)
    assert after.mtime_ns == before.mtime_ns
    assert after != before  # the ctime moved, and nothing can set it back


def test_a_file_replaced_by_rename_gets_a_new_key(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 100)
    before = file_identity(model)
    fresh = tmp_path / "model.gguf.part"
    fresh.write_bytes(b"b" * 100)
    os.utime(fresh, ns=(before.mtime_ns, before.mtime_ns))  # even with the same size and mtime
    os.replace(fresh, model)
    after = file_identity(model)
    assert after.path == before.path and after.inode != before.inode
    assert after != before


def test_a_missing_file_has_no_identity(tmp_path):
    assert file_identity(tmp_path / "absent.gguf") is None
    assert file_identity("") is None
    assert file_identity("bad\0path") is None


def test_the_same_file_through_a_symlink_has_the_same_key(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 100)
    link = tmp_path / "current.gguf"
    link.symlink_to(model)
    assert file_identity(link) == file_identity(model)
    assert str(file_identity(link)) == str(file_identity(model))
    assert file_identity(link).path == str(model.resolve())


def test_an_unchanged_file_keeps_its_key(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 100)
    assert file_identity(model) == file_identity(model)
    assert hash(file_identity(model)) == hash(file_identity(model))


def test_the_text_form_starts_with_the_resolved_path_and_is_stable(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 100)
    identity = file_identity(model)
    st = os.stat(model)
    assert str(identity) == (f"{model.resolve()}|{st.st_dev}:{st.st_ino}|100|"
                             f"{st.st_mtime_ns}|{st.st_ctime_ns}")
    assert isinstance(identity, FileIdentity)


def test_a_directory_changes_key_when_a_file_under_it_is_rewritten_in_place(tmp_path):
    model = tmp_path / "hf-model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    shard = model / "sub" / "model.safetensors"
    shard.write_bytes(b"a" * 100)
    before = file_identity(model)
    assert before.contents and str(before).endswith(f"|tree:{before.contents}")
    rewrite(shard, b"b" * 100)  # the directory's own mtime does not move
    after = file_identity(model)
    assert os.stat(model).st_mtime_ns == before.mtime_ns
    assert after != before


def test_the_header_cache_reads_a_gguf_again_after_it_is_replaced_in_place(tmp_path):
    model = write_model(tmp_path / "model.gguf", n_embd=64, n_ff=128, n_layers=2)
    first = modelfacts.read(model)
    other = write_model(tmp_path / "other.gguf", n_embd=64, n_ff=128, n_layers=3)
    time.sleep(TICK)
    model.write_bytes(other.read_bytes())  # truncate and write: same path, same inode
    assert modelfacts.read(model).block_count == 3 != first.block_count


def test_the_digest_cache_hashes_a_file_again_after_a_same_size_rewrite(tmp_path):
    recorder = RunRecorder(tmp_path / "state")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 100)
    first = recorder.digest(str(model))
    assert recorder.digest(str(model)) == first
    rewrite(model, b"b" * 100)
    assert recorder.digest(str(model)) != first
    assert list(recorder._load_hashes()) == [str(file_identity(model))]  # the stale one is gone
