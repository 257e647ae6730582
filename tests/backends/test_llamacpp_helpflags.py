"""plugins/llamacpp/helpflags.py: the flags a llama-server build takes, from its own `--help`
(the real texts of b11434, the build specfleet is written against and the newest on PyPI,
of b10405 and of b9093, the oldest there, recorded in tests/fixtures/), and a command line
checked against them."""

from __future__ import annotations

from pathlib import Path

from plugins.llamacpp.helpflags import HelpFlags, flag_problems, flags_of, parse_help

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
B11434 = parse_help((FIXTURES / "llama-server-b11434-help.txt").read_text())
B10405 = parse_help((FIXTURES / "llama-server-b10405-help.txt").read_text())
B9093 = parse_help((FIXTURES / "llama-server-b9093-help.txt").read_text())


def test_every_spelling_of_an_entry_is_a_flag_and_knows_whether_it_takes_a_value():
    flags = B11434.takes_value
    assert len(flags) > 350  # b11434 lists some 410 spellings
    for flag in ("-c", "--ctx-size", "-t", "--threads", "--port", "--spec-type",
                 "--spec-draft-n-max", "--spec-ngram-mod-n-max", "--load-mode", "-m"):
        assert flags[flag] is True, flag
    for flag in ("--metrics", "--perf", "--no-perf", "-kvo", "--no-kv-offload", "-nkvo",
                 "--no-host"):
        assert flags[flag] is False, flag
    # b11434 replaced --no-mmap and --mlock by --load-mode; the build rejects both.
    assert "--no-mmap" not in flags and "--mlock" not in flags


def test_removed_flags_carry_the_replacement_the_help_names():
    assert B11434.removed["--draft-max"] == "use --spec-draft-n-max or --spec-ngram-mod-n-max"
    assert B11434.removed["--draft"] == B11434.removed["--draft-n"] == \
        B11434.removed["--draft-max"]
    assert B11434.removed["--spec-ngram-size-n"] == (
        "use the respective --spec-ngram-*-size-n or --spec-ngram-mod-n-match")
    assert "--spec-ngram-min-hits" in B11434.removed
    assert "--defrag-thold" in B11434.deprecated and "-dt" in B11434.deprecated
    assert "--ctx-size" not in B11434.removed


def test_a_command_line_is_read_as_the_build_reads_it():
    argv = ["--ctx-size", "2048", "--temp", "-1", "--metrics", "--port=8080", "-ngl", "-1",
            "--no-perf", "value-of-nothing"]
    assert flags_of(argv, B11434) == [(0, "--ctx-size"), (2, "--temp"), (4, "--metrics"),
                                      (5, "--port"), (6, "-ngl"), (8, "--no-perf")]
    # A flag the build does not know is taken to take no value: the next flag still counts.
    assert flags_of(["--ctx-sise", "--metrics"], B11434) == [(0, "--ctx-sise"), (1, "--metrics")]


def test_each_problem_names_the_flag_and_what_the_help_says():
    argv = ["--ctx-sise", "2048", "--spec-ngram-size-n", "4", "--no-mmap", "--draft-max", "8",
            "--ctx-size", "1024"]
    assert flag_problems(argv, B11434) == [
        (0, "--ctx-sise", "is not one of its flags (did you mean --ctx-size?)"),
        (2, "--spec-ngram-size-n", "is listed as removed: use the respective "
                                   "--spec-ngram-*-size-n or --spec-ngram-mod-n-match"),
        (4, "--no-mmap", "is not one of its flags"),
        (5, "--draft-max", "is listed as removed: use --spec-draft-n-max or "
                           "--spec-ngram-mod-n-max")]


def test_a_help_that_is_not_a_llama_servers_lists_no_flag():
    assert parse_help("") == HelpFlags()
    assert parse_help("sleep: unrecognized option '--help'\nTry 'sleep --help'\n") == HelpFlags()


def test_an_older_build_takes_what_it_lists_and_refuses_what_came_later():
    # b9093 still had --mlock and --no-mmap (b11434 replaced them by --load-mode), had no
    # --spec-synth-rates, and its --spec-type knew the n-gram kinds only.
    assert flag_problems(["--no-mmap", "--mlock", "--ctx-size", "2048"], B9093) == []
    assert flag_problems(["--load-mode", "mmap", "--spec-synth-rates", "0.9"], B9093) == [
        (0, "--load-mode", "is not one of its flags"),
        (2, "--spec-synth-rates", "is not one of its flags")]
    assert [w for _, _, w in flag_problems(["--no-mmap"], B11434)] == ["is not one of its flags"]
    # The draft flags specfleet generates were already there; the value was not.
    draft = ["--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf",
             "--spec-draft-n-max", "4"]
    assert flag_problems(draft, B11434) == []
    assert flag_problems(draft, B9093) == [
        (0, "--spec-type", "does not take 'draft-simple' (its values: none, ngram-cache, "
                           "ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod)")]
    assert B9093.removed["--draft-max"] == B11434.removed["--draft-max"]


def test_the_values_a_help_lists_are_checked_one_or_a_list_of_them():
    assert B11434.choices["--flash-attn"] == (("on", "off", "auto"), False)
    assert B11434.choices["--spec-type"][1] is True  # b11434 takes a list: ngram-mod,draft-mtp
    assert flag_problems(["--spec-type=ngram-mod,draft-simple", "-fa", "on"], B11434) == []
    assert flag_problems(["-fa", "yes"], B11434) == [
        (0, "-fa", "does not take 'yes' (its values: on, off, auto)")]
    assert "--tensor-split" not in B11434.choices  # N0,N1,N2,... is a placeholder, not values


def test_three_builds_each_take_the_flags_of_their_time():
    def refused(argv: list[str], build: HelpFlags) -> list[str]:
        return [flag for _, flag, _ in flag_problems(argv, build)]

    # --no-mmap: taken by b9093, deprecated by b10405 in favour of --load-mode, gone in b11434.
    assert refused(["--no-mmap"], B9093) == refused(["--no-mmap"], B10405) == []
    assert "--no-mmap" in B10405.deprecated and "--mlock" in B10405.deprecated
    assert refused(["--no-mmap"], B11434) == ["--no-mmap"]
    assert refused(["--load-mode", "mmap"], B9093) == ["--load-mode"]
    assert refused(["--load-mode", "mmap"], B10405) == refused(["--load-mode", "mmap"], B11434) == []
    # The synthetic acceptance of the tuner's calibration came with b11434.
    synth = ["--spec-synth-rates", "0.9,0.5", "--spec-synth-len", "4"]
    assert refused(synth, B10405) == ["--spec-synth-rates", "--spec-synth-len"]
    assert refused(synth, B11434) == []
    # A draft model's spec type: b10405 takes the list b11434 does.
    assert B10405.choices["--spec-type"] == B11434.choices["--spec-type"]
    assert all(B.removed["--draft-max"] for B in (B9093, B10405, B11434))
