"""The generation and method benchmarks run end to end at toy size and print the rows they promise (their
numbers are the benchmarks' to report, not the suite's)."""

from __future__ import annotations

import pytest
from support.tools import load_tool


def test_the_serving_table_has_a_row_per_batch_and_start(exports, capsys):
    tool = load_tool("bench_generate")
    assert tool.main(["--batches", "1,3", "--models", f"{exports['llama-implicit']},tiny/mamba2-explicit",
                      "--new-tokens", "2", "--prompt-lengths", "2,5"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[-6], r[-5]) for r in rows] == [("1", "cold"), ("3", "cold"), ("1", "warm"), ("3", "warm"),
                                              ("1", "cold"), ("3", "cold")]
    assert all(float(r[-4]) > 0 and float(r[-2]) >= 1 for r in rows)
    assert [r[-2] for r in rows[-2:]] == ["1.00", "1.00"]  # the explicit model: one pass per token


@pytest.mark.slow  # over 10 s on 2 cores: the full tier runs it
def test_the_warm_start_table_compares_three_starts(exports, capsys):
    tool = load_tool("bench_warm_start")
    assert tool.main([str(exports["mamba2-implicit"]), "--prompts", "2", "--new-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "agreement over" in lines[0]
    rows = {line[:18].strip(): line[18:].split() for line in lines[2:]}
    assert set(rows) == {"cold", "warm", "cold, tol/10"}
    assert rows["cold"][3] == "1.0000" and rows["cold, tol/10"][2] == "1.0000"  # each agrees with itself
    assert float(rows["cold, tol/10"][0]) >= float(rows["cold"][0])  # a tighter tolerance: no fewer passes


def test_the_method_table_has_both_passes_their_ratio_and_a_step_per_mode(capsys):
    tool = load_tool("bench_method")
    assert tool.main(["--configs", "tiny/mamba2-implicit", "--d-model", "32", "--layers", "1", "--seq-len", "16",
                      "--short", "4", "--batch", "1", "--chunk", "16", "--repeats", "1", "--vocab-size", "64"]) == 0
    rows = [[cell.strip() for cell in line.split("|")] for line in capsys.readouterr().out.splitlines()[3:]]
    assert [r[1] for r in rows] == ["pass, 4 tokens", "pass, 16 tokens", "pass 4 / 16 tokens", "training step explicit",
                                    "training step (4+1)", "training step (24+4)"]
    assert all(float(r[2]) > 0 for r in rows if r[2]) and float(rows[2][4].rstrip("x")) > 0
    assert [r[5] for r in rows[3:5]] == ["0+1", "4+1"] and rows[5][5].endswith("+4")
