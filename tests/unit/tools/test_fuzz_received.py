"""tools/dev/fuzz_received.py holds each reader of received files to its word: a few hundred seeded
mutations per kind end in the reader's own error naming the file, or read the same as the valid file,
never a traceback, a hang or a write outside. And the fuzzer finds what it should: a reader that
waits on a FIFO, or takes another result without a word, is reported."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEV = ROOT / "tools" / "dev"
CASES = 60  # per kind and seed: the quick tier's share (the note gives 2,000 per kind under three seeds)


def load(name: str):
    if str(DEV) not in sys.path:
        sys.path.insert(0, str(DEV))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DEV / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind", ["shards", "index-cache", "tokenizer", "checkpoint", "export", "config", "hostfile",
                                  "env-file"])
def test_every_reader_holds_to_its_word(kind, monkeypatch, tmp_path):
    fuzz, kinds = load("fuzz_received"), load("fuzz_kinds")
    if kind not in kinds.KINDS:
        pytest.fail(f"no fuzzed reader for {kind}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    assert fuzz.fuzz(kinds.KINDS[kind], seed=11, cases=CASES, timeout=10.0, say=lambda line: None) == []


def test_the_fuzzer_reports_a_hang_a_traceback_and_a_silent_change(tmp_path):
    fuzz = load("fuzz_received")

    def make(folder, outside):
        (folder / "value.txt").write_text("12\n")
        return folder / "value.txt"

    def naive(path):  # reads a FIFO (waits for ever), a folder (IsADirectoryError), any number as sent
        return int(open(path).read() or 0)

    kind = fuzz.Kind("naive", make, naive, (ValueError,), lambda p: [p], changes_are_data=False)
    findings = fuzz.fuzz(kind, seed=3, cases=80, timeout=0.5, say=lambda line: None)
    said = "\n".join(findings)
    for finding in ("made a FIFO: hang", "IsADirectoryError (not the reader's error)", "without a word"):
        assert finding in said, said
    assert all(line.startswith("naive seed 3 case ") for line in findings)


def test_the_command_line_prints_a_table_and_exits_1_on_a_finding(capsys):
    fuzz = load("fuzz_received")
    assert fuzz.main(["--seed", "1", "--cases", "20", "--kind", "hostfile", "--kind", "env-file"]) == 0
    out = capsys.readouterr().out
    assert "| hostfile | 20 | 0 |" in out and "| env-file | 20 | 0 |" in out
    assert os.path.isfile(DEV / "fuzz_received.py")
