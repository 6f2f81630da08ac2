"""The language-modelling page is made from the saved results alone: its tables show what the
results hold (means over seeds, the ratio to the trained length), and its plots are written."""

from __future__ import annotations

import json
import statistics

import pytest

from implicit_megatron.research.language_modeling_report import lengths_of, tables, write_page, write_sweep
from implicit_megatron.research.state_tracking_report import bootstrap_interval


def buckets(ppl: float, length: int) -> list[dict]:
    return [{"start": s, "end": s + length // 4, "ppl": ppl + s / 100} for s in range(0, length, length // 4)]


def run(ppl_64: float, ppl_128: float, parameters: int) -> dict:
    return {"parameters": parameters, "tokens": 2048, "val_ppl": ppl_64 + 1,
            "curve": [[1024, 300.0], [2048, ppl_64 + 1]],
            "lengths": {"64": {"ppl": ppl_64, "positions": buckets(ppl_64, 64)},
                        "128": {"ppl": ppl_128, "positions": buckets(ppl_128, 128)}}}


@pytest.fixture
def results() -> dict:
    return {"command": "python tools/research/language_modeling.py --seeds 2", "notes": "A plain reading.",
            "settings": {"seq_len": 64, "description": "Two seeds of a toy sweep."},
            "runs": {"explicit": {"0": run(100.0, 150.0, 1000), "1": run(110.0, 143.0, 1000)},
                     "implicit": {"0": run(120.0, 120.0, 1100), "1": run(124.0, 130.2, 1100)}}}


def test_tables_show_the_mean_over_seeds_and_the_ratio_to_the_trained_length(results):
    text = tables(results)
    lines = text.splitlines()
    assert lengths_of(results) == ["64", "128"]
    assert "| model | L64 | L128 |" in lines
    low, high = bootstrap_interval([150.0, 143.0])
    sd = statistics.stdev([150.0, 143.0])
    assert f"| explicit (2 seeds) | 105.000 ± 7.071 [100.000, 110.000] | 146.500 ± {sd:.3f} [{low:.3f}, {high:.3f}] |" \
        in lines
    ratios = [r for r in lines if r.startswith("| implicit") and "1.000 ± 0.000" in r]
    assert len(ratios) == 1 and "1.025 ± 0.035" in ratios[0]  # 120/120 and 130.2/124: mean 1.025
    assert "| implicit | 1,100 | 2,048 | 123.000 ± 2.828 [121.000, 125.000] |" in lines


def test_the_page_is_rebuilt_from_every_saved_sweep(results, tmp_path):
    page = tmp_path / "language_modeling.md"
    files = write_sweep(results, page.with_suffix(""), "toy-2")
    assert [f.name for f in files] == ["toy-2-positions.png", "toy-2-curves.png"]
    assert all(f.read_bytes().startswith(b"\x89PNG") for f in files)
    other = json.loads(json.dumps(results))
    other["command"] = "python tools/research/language_modeling.py --seeds 1"
    write_sweep(other, page.with_suffix(""), "a-first")
    text = write_page(page).read_text()
    assert text.startswith("# Language modelling: explicit against implicit Mamba2")
    assert text.index("## a-first") < text.index("## toy-2")
    assert "python tools/research/language_modeling.py --seeds 2" in text and "A plain reading." in text
    assert "![per-position perplexity](language_modeling/toy-2-positions.png)" in text
