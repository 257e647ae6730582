"""The pairing guard on GGUF files written by the gguf package, and on the real gemma GGUF."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import yaml

from supervisor.cli.main import main
from supervisor.models import facts as modelfacts
from supervisor.models import pairing
from tests.ggufs import VOCAB, write_model

F16 = gguf.GGMLQuantizationType.F16


def check(target, draft, method="draft"):
    return pairing.check_pair(modelfacts.read(target), modelfacts.read(draft), method,
                              modelfacts.read_tokens)


def errors(findings):
    return [f.message for f in findings if f.level == "error"]


def warnings(findings):
    return [f.message for f in findings if f.level == "warning"]


@pytest.fixture
def big(tmp_path):
    return write_model(tmp_path / "target.gguf", n_embd=256, n_ff=1024, n_layers=4)


def test_our_header_reader_agrees_with_the_gguf_packages_reader(big):
    facts = modelfacts.read(big)
    reader = gguf.GGUFReader(str(big))
    assert facts.architecture == reader.fields["general.architecture"].contents()
    assert facts.parameters == sum(int(t.n_elements) for t in reader.tensors)
    assert facts.weight_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert facts.embedding_length == reader.fields["llama.embedding_length"].contents()
    assert facts.tokenizer.n_tokens == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert modelfacts.read_tokens(big) == reader.fields["tokenizer.ggml.tokens"].contents()


@pytest.mark.parametrize("data", [b"", b"GGUF", b"GGUF\x03\x00", b"GGUF\x09\x00\x00\x00",
                                  b"NOTGGUF!"])
def test_a_broken_or_truncated_file_is_a_clear_error_and_leaves_no_file_open(tmp_path, data):
    # filterwarnings = error: an unclosed file would fail here as a ResourceWarning.
    path = tmp_path / "broken.gguf"
    path.write_bytes(data)
    with pytest.raises(modelfacts.SpecfleetError, match=r"broken\.gguf"):
        modelfacts.read(str(path))


def test_a_gguf_file_shorter_than_its_header_says_is_found_truncated(tmp_path, big):
    from supervisor.models import gguf as ggufheader

    data = Path(big).read_bytes()
    assert ggufheader.truncation(Path(big)) is None
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-1])  # one byte short of its last tensor's end
    said = ggufheader.truncation(cut)
    assert said is not None and f"end at byte {len(data):,}" in said
    assert f"the file has {len(data) - 1:,} bytes" in said
    files = {"model": str(big), "draft": str(cut)}
    assert ggufheader.incomplete(files) == f"draft file {said}"
    assert ggufheader.incomplete({"model": str(big)}) is None
    (tmp_path / "notes.txt").write_text("not a model")  # not GGUF: the runtime's to judge
    assert ggufheader.incomplete({"model": str(tmp_path / "notes.txt")}) is None
    cut.write_bytes(data[:6])  # the header itself cut: the runtime's to say, never raised
    assert ggufheader.incomplete({"model": str(cut)}) is None


def test_a_tensor_type_the_gguf_package_cannot_size_is_left_to_the_runtime(
        tmp_path, big, monkeypatch):
    """A model of a newer quantization than the installed gguf package knows: the check
    cannot size its tensors, so it does not judge (before: a KeyError out of check, a start
    and an on-demand load)."""
    from supervisor.models import gguf as ggufheader

    def unknown(shape, ttype):
        raise KeyError(ttype)  # as gguf.GGML_QUANT_SIZES does for a type it lacks

    copy = tmp_path / "newer.gguf"
    copy.write_bytes(Path(big).read_bytes())
    monkeypatch.setattr(ggufheader, "tensor_bytes", unknown)
    ggufheader._truncation_of.cache_clear()
    assert ggufheader.incomplete({"model": str(copy)}) is None


def test_a_small_draft_of_the_same_family_passes(tmp_path, big):
    draft = write_model(tmp_path / "draft.gguf", n_embd=64, n_ff=128, n_layers=2)
    assert check(big, draft) == []


def test_a_mismatched_vocabulary_is_refused_and_the_differing_token_shown(tmp_path, big):
    tokens = list(VOCAB)
    tokens[42] = "something-else"
    draft = write_model(tmp_path / "draft.gguf", tokens=tokens)
    (message,) = errors(check(big, draft))
    assert "does not share the target's tokenizer" in message
    assert "token 42 differs: target 'tok42', draft 'something-else'" in message
    assert "rejected almost always" in message  # the consequence, in plain words


def test_a_vocabulary_of_another_size_is_refused(tmp_path, big):
    draft = write_model(tmp_path / "draft.gguf", tokens=VOCAB + [f"x{i}" for i in range(200)])
    (message,) = errors(check(big, draft))
    assert "vocabulary sizes differ: target 300 tokens, draft 500" in message


def test_mismatched_special_tokens_are_refused(tmp_path, big):
    draft = write_model(tmp_path / "draft.gguf", eos=3)
    (message,) = errors(check(big, draft))
    assert "special token eos has id 1 in the target but 3 in the draft" in message


def test_another_tokenizer_type_is_refused(tmp_path, big):
    draft = write_model(tmp_path / "draft.gguf", tokenizer_model="gpt2")
    (message,) = errors(check(big, draft))
    assert "tokenizer type differs: target llama, draft gpt2" in message


def test_a_draft_that_is_too_large_gets_a_warning(tmp_path, big):
    draft = write_model(tmp_path / "draft.gguf", n_embd=256, n_ff=512, n_layers=4)
    findings = check(big, draft)
    assert errors(findings) == []
    (message,) = warnings(findings)
    assert "smaller (at least 5x is needed to pay)" in message
    assert "speculation will likely make this target slower" in message


def test_a_draft_quantized_less_aggressively_gets_a_warning(tmp_path, big):
    draft = write_model(tmp_path / "draft.gguf", qtype=F16)
    (message,) = warnings(check(big, draft))
    assert "quantized less aggressively than the target (16.0 bits per weight" in message


def test_an_eagle3_head_of_the_wrong_width_is_refused(tmp_path, big):
    head = write_model(tmp_path / "head.gguf", arch="eagle3", n_layers=1,
                       extra={"eagle3.target_hidden_size": 128,
                              "eagle3.target_layers": [0, 1, 2]})
    (message,) = errors(check(big, head, "eagle3"))
    assert "expects a target hidden size of 128, but the target (llama) has 256" in message
    assert "cannot read this target's hidden states" in message


def test_an_eagle3_head_that_fits_passes_and_one_reading_missing_layers_is_refused(tmp_path, big):
    good = write_model(tmp_path / "good.gguf", arch="eagle3", n_layers=1,
                       extra={"eagle3.target_hidden_size": 256, "eagle3.target_layers": [0, 1, 3]})
    assert check(big, good, "eagle3") == []
    deep = write_model(tmp_path / "deep.gguf", arch="eagle3", n_layers=1,
                       extra={"eagle3.target_hidden_size": 256, "eagle3.target_layers": [1, 9, 30]})
    (message,) = errors(check(big, deep, "eagle3"))
    assert "reads target layers [1, 9, 30], but the target has only 4 layers" in message


def test_a_plain_model_given_as_an_eagle3_head_is_refused(tmp_path, big):
    draft = write_model(tmp_path / "draft.gguf")
    (message,) = errors(check(big, draft, "eagle3"))
    assert "is a llama model, not an EAGLE-3 head" in message


def test_mtp_needs_next_n_layers_in_the_target_or_a_head(big):
    (message,) = errors(pairing.check_mtp(modelfacts.read(big), None))
    assert "carries no MTP (next-n) layers" in message


def test_the_real_gemma_gguf_is_a_matched_pair_with_itself(gemma_model):
    findings = check(gemma_model, gemma_model)
    assert errors(findings) == []
    assert [w for w in warnings(findings) if "only 1.0x smaller" in w]  # self-draft: too large
    facts = modelfacts.read(gemma_model)
    assert (facts.architecture, facts.tokenizer.n_tokens, facts.swa_layers) == ("gemma3", 262144, 15)


def test_check_refuses_a_mismatched_pair_with_file_line_and_path(tmp_path, big, capsys):
    tokens = list(VOCAB)
    tokens[7] = "other"
    draft = write_model(tmp_path / "draft.gguf", tokens=tokens)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"version": 1, "daemon": {"state_dir": str(tmp_path / "s")},
                                     "targets": {"chat": {
                                         "model": str(big), "port": 18123, "binary": "/bin/true",
                                         "speculation": {"method": "draft",
                                                         "draft": str(draft)}}}},
                                    sort_keys=False))
    assert main(["check", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert f"{fleet}:" in err
    assert "targets.chat.speculation.draft: the draft" in err
    assert "token 7 differs: target 'tok7', draft 'other'" in err
    assert "Traceback" not in err


def write_hf_dir(path, vocab, hidden, layers, dtype="bfloat16", eos="</s>"):
    """A Hugging Face model directory as vLLM reads it: config, tokenizer, safetensors."""
    import json
    import struct

    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": 2,
        "intermediate_size": 4 * hidden, "max_position_embeddings": 4096,
        "vocab_size": len(vocab), "torch_dtype": dtype}))
    (path / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(vocab)}},
        "added_tokens": []}))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>",
                                                             "eos_token": eos}))
    tensors, offset = {}, 0
    for i in range(layers):
        n = hidden * 4 * hidden * 2  # bf16 bytes of one up-projection
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = {
            "dtype": "BF16", "shape": [4 * hidden, hidden], "data_offsets": [offset, offset + n]}
        offset += n
    header = json.dumps(tensors).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header
                                             + bytes(offset))


def test_hugging_face_directories_are_paired_by_their_tokenizer_files(tmp_path):
    vocab = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(200)]
    write_hf_dir(tmp_path / "target", vocab, hidden=256, layers=8)
    write_hf_dir(tmp_path / "draft", vocab, hidden=64, layers=2)
    other = list(vocab)
    other[50] = "zzz"
    write_hf_dir(tmp_path / "other", other, hidden=64, layers=2)
    target = modelfacts.read(tmp_path / "target")
    assert (target.format, target.embedding_length, target.parameters) == ("hf", 256, 8 * 256 * 1024)
    assert check(tmp_path / "target", tmp_path / "draft") == []
    (message,) = errors(check(tmp_path / "target", tmp_path / "other"))
    assert "token 50 differs: target 'w47', draft 'zzz'" in message
