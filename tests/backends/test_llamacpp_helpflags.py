"""plugins/llamacpp/helpflags.py: the flags a llama-server build takes, from its own `--help`
(the real b11434 text, recorded in tests/fixtures/), and a command line checked against
them."""

from __future__ import annotations

from pathlib import Path

from plugins.llamacpp.helpflags import HelpFlags, flag_problems, flags_of, parse_help

B11434 = parse_help((Path(__file__).resolve().parents[1] / "fixtures"
                     / "llama-server-b11434-help.txt").read_text())


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
