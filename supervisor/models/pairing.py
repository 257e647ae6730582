"""Pairing guard: will this draft (or head) work with this target? Pure functions of facts.

The failures it catches run without any error message: a draft with another
tokenizer accepts almost nothing, a draft close in size to the target costs more
than it saves, a full-precision draft next to a 4-bit target wastes its memory and
time, and a head trained for another model produces garbage proposals.

Tokenizer rules follow llama.cpp's own compatibility check (common/speculative.cpp,
`common_speculative_are_compatible`), made stricter where it silently gives up:
same vocabulary type, same special token ids, the same token text at every id the two
share, and vocabulary sizes at most 128 apart (padding rows differ between model sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from supervisor.models.facts import ModelFacts

MIN_SIZE_RATIO = 5.0  # a draft should have at most a fifth of the target's parameters
MAX_VOCAB_DIFFERENCE = 128  # llama.cpp SPEC_VOCAB_MAX_SIZE_DIFFERENCE
# llama.cpp compares token texts from id 5 on (SPEC_VOCAB_CHECK_START_TOKEN_ID): families
# spell their first control tokens differently; the special ids are compared on their own.
FIRST_COMPARED_TOKEN = 5
QUANT_SLACK = 1.25  # draft bits per weight above target's x this: "less aggressively quantized"


@dataclass(frozen=True)
class Finding:
    level: str  # "error" (refused) | "warning"
    message: str


def _size(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def check_pair(target: ModelFacts, draft: ModelFacts, method: str,
               tokens: Callable[[str], list[str]] | None = None) -> list[Finding]:
    """Findings for `draft` serving `target` with speculation `method` (draft, eagle3, mtp,
    dflash). `tokens(path)` reads a token list, to name the first differing token."""
    if method == "eagle3" or draft.is_eagle3:
        return check_eagle3(target, draft, method)
    if method == "mtp":
        return check_mtp(target, draft)
    findings = check_tokenizers(target, draft, tokens)
    findings += check_size(target, draft)
    findings += check_quantization(target, draft)
    return findings


def check_tokenizers(target: ModelFacts, draft: ModelFacts,
                     tokens: Callable[[str], list[str]] | None = None) -> list[Finding]:
    t, d = target.tokenizer, draft.tokenizer
    consequence = ("its drafts would be rejected almost always, so speculation would only "
                   "slow the target down")
    if t is None or d is None:
        missing = target.path if t is None else draft.path
        return [Finding("warning", f"{missing} carries no tokenizer, so specfleet cannot check "
                        "that the draft and the target tokenize text the same way")]
    problems = []
    if t.model != d.model:
        problems.append(f"tokenizer type differs: target {t.model}, draft {d.model}")
    for name in sorted(set(t.special) | set(d.special)):
        if name in t.special and name in d.special and t.special[name] != d.special[name]:
            problems.append(f"special token {name} has id {t.special[name]} in the target but "
                            f"{d.special[name]} in the draft")
    for flag in ("add_bos", "add_eos"):
        a, b = getattr(t, flag), getattr(d, flag)
        if a is not None and b is not None and a != b:
            problems.append(f"{flag} differs: target {a}, draft {b}")
    if abs(t.n_tokens - d.n_tokens) > MAX_VOCAB_DIFFERENCE:
        problems.append(f"vocabulary sizes differ: target {t.n_tokens} tokens, draft "
                        f"{d.n_tokens} (more than {MAX_VOCAB_DIFFERENCE} apart)")
    elif t.tokens_sha256 != d.tokens_sha256 and tokens is not None:
        first = first_difference(tokens(target.path), tokens(draft.path))
        if first is not None:
            i, a, b = first
            problems.append(f"token {i} differs: target {a!r}, draft {b!r}")
    elif t.tokens_sha256 != d.tokens_sha256 and t.n_tokens == d.n_tokens:
        problems.append("the token lists differ")
    if problems:
        return [Finding("error", f"the draft {draft.path} does not share the target's tokenizer "
                        f"({'; '.join(problems)}): {consequence}. Use a draft from the same "
                        "model family as the target")]
    return []


def first_difference(a: list[str], b: list[str]) -> tuple[int, str, str] | None:
    """The first id (of those both lists have, from FIRST_COMPARED_TOKEN) whose text differs."""
    for i in range(FIRST_COMPARED_TOKEN, min(len(a), len(b))):
        x, y = a[i], b[i]
        if x != y:
            return i, x, y
    return None


def check_size(target: ModelFacts, draft: ModelFacts) -> list[Finding]:
    if not draft.parameters or not target.parameters:
        return []
    ratio = target.parameters / draft.parameters
    if ratio < MIN_SIZE_RATIO:
        return [Finding("warning", f"the draft has {_size(draft.parameters)} parameters, the "
                        f"target {_size(target.parameters)}: only {ratio:.1f}x smaller (at least "
                        f"{MIN_SIZE_RATIO:g}x is needed to pay). Drafting costs almost as much as "
                        "verifying, so speculation will likely make this target slower; use a "
                        "smaller draft or n-gram speculation")]
    return []


def check_quantization(target: ModelFacts, draft: ModelFacts) -> list[Finding]:
    tb, db = target.block_bits_per_weight, draft.block_bits_per_weight
    if tb is None or db is None or db <= tb * QUANT_SLACK:
        return []
    return [Finding("warning", f"the draft is quantized less aggressively than the target "
                    f"({db:.1f} bits per weight{_ft(draft)} against {tb:.1f}{_ft(target)}): it "
                    "spends memory and time on precision the target does not have, and a "
                    "draft only has to guess well; a 4- to 8-bit draft drafts as well and faster")]


def _ft(facts: ModelFacts) -> str:
    return f", {facts.file_type}" if facts.file_type else ""


def check_eagle3(target: ModelFacts, head: ModelFacts, method: str) -> list[Finding]:
    findings = []
    if method != "eagle3":
        findings.append(Finding("error", f"{head.path} is an EAGLE-3 head, not a draft model; "
                                f"set method: eagle3 (method is {method})"))
        return findings
    if not head.is_eagle3:
        return [Finding("error", f"{head.path} is a {head.architecture} model, not an EAGLE-3 "
                        "head (its architecture must be eagle3): llama-server would refuse it "
                        "or draft nonsense. Convert the head with llama.cpp's convert script")]
    consequence = "it was trained for another model and cannot read this target's hidden states"
    if head.target_hidden_size is not None and target.embedding_length is not None \
            and head.target_hidden_size != target.embedding_length:
        findings.append(Finding("error", f"the EAGLE-3 head {head.path} expects a target hidden "
                                f"size of {head.target_hidden_size}, but the target "
                                f"({target.architecture}) has {target.embedding_length}: "
                                f"{consequence}"))
    if head.target_layers and target.block_count is not None \
            and max(head.target_layers) >= target.block_count:
        findings.append(Finding("error", f"the EAGLE-3 head {head.path} reads target layers "
                                f"{list(head.target_layers)}, but the target has only "
                                f"{target.block_count} layers: {consequence}"))
    if head.n_vocab and target.n_vocab and head.tokenizer and target.tokenizer \
            and abs(head.n_vocab - target.n_vocab) > MAX_VOCAB_DIFFERENCE:
        findings.append(Finding("error", f"the EAGLE-3 head {head.path} has a vocabulary of "
                                f"{head.n_vocab} tokens, the target {target.n_vocab}: "
                                f"{consequence}"))
    return findings


def check_mtp(target: ModelFacts, head: ModelFacts | None) -> list[Finding]:
    """`head` is the separate MTP file, or None when the target must carry the MTP layers."""
    if head is None:
        if target.nextn_layers:
            return []
        return [Finding("error", f"the target {target.path} carries no MTP (next-n) layers and "
                        "no MTP head file is set: method mtp needs one or the other. Set "
                        "speculation.draft to the MTP head, or use another method")]
    findings = []
    if head.architecture != target.architecture:
        findings.append(Finding("error", f"the MTP head {head.path} is for {head.architecture}, "
                                f"the target is {target.architecture}: an MTP head only works "
                                "with the model it was trained with"))
    elif head.embedding_length and target.embedding_length \
            and head.embedding_length != target.embedding_length:
        findings.append(Finding("error", f"the MTP head {head.path} has width "
                                f"{head.embedding_length}, the target {target.embedding_length}: "
                                "it belongs to another size of the model"))
    if not head.nextn_layers and not findings:
        findings.append(Finding("error", f"{head.path} carries no MTP (next-n) layers: it is not "
                                "an MTP head"))
    return findings
