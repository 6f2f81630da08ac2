"""Word-problem evaluation (accuracy, last-10 accuracy, passes, both modes) and the sweep's report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipeline.synthetic.word_problem import generate
from implicit_megatron import build_model, load_config
from implicit_megatron.evaluation.word_problems import evaluate_words
from implicit_megatron.research import state_tracking_report as report
from implicit_megatron.research.state_tracking_report import bootstrap_interval, tables, write_page, write_sweep

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["task.word_problem.algebra=S3", "model.vocab_size=6", "model.d_model=32", "model.mamba2.headdim=16",
         "model.mamba2.d_state=16", "model.mamba2.chunk_size=8", "data.seq_len=16"]


def model_of(kind: str, *extra: str):
    torch.manual_seed(0)
    cfg = load_config(ROOT / f"configs/state_tracking/mamba2-{kind}.yaml", [*SMALL, *extra], check_files=False)
    return build_model(cfg).double()


def words_and_labels(length: int = 24, n: int = 10):
    words, labels = generate("S3", n, length, 0.5, seed=3)
    return torch.from_numpy(words.astype("int64")), torch.from_numpy(labels.astype("int64"))


def test_accuracies_count_the_argmax_over_all_and_the_last_positions():
    model = model_of("explicit")
    words, labels = words_and_labels()
    result = evaluate_words(model, words, labels, batch_size=4)
    with torch.no_grad():
        hits = (model(words)[..., :6].argmax(-1) == labels).double()
    assert result.accuracy == pytest.approx(hits.mean().item())
    assert result.accuracy_last == pytest.approx(hits[:, -10:].mean().item())
    assert (result.passes, result.converged, result.words, result.length) == (1, 1.0, 10, 24)


def test_sequential_mode_of_an_explicit_model_predicts_as_the_whole_sequence():
    model = model_of("explicit")
    words, labels = words_and_labels()
    whole = evaluate_words(model, words, labels, batch_size=5)
    token_by_token = evaluate_words(model, words, labels, batch_size=5, sequential=True)
    assert token_by_token.accuracy == pytest.approx(whole.accuracy)
    assert token_by_token.accuracy_last == pytest.approx(whole.accuracy_last)


def test_implicit_model_reports_its_test_time_passes():
    model = model_of("implicit", "implicit.eval_max_iter=6")
    words, labels = words_and_labels(length=12, n=4)
    result = evaluate_words(model, words, labels, batch_size=4)
    assert model.core.last_stats.passes == result.passes and 1 < result.passes <= 6
    assert result.converged == model.core.last_stats.converged.double().mean().item()
    sequential = evaluate_words(model, words, labels, batch_size=4, sequential=True)
    assert 1 < sequential.passes <= 6 and sequential.length == 12


def sweep_results() -> dict:
    def run(acc: float) -> dict:
        return {name: {"accuracy": acc, "accuracy_last": acc, "passes": 3.0, "converged": 1.0, "words": 8,
                       "length": int(name[1:].split("-")[0])} for name in ("L8", "L32", "L8-p0.5")}

    return {"command": "python tools/research/state_tracking.py --algebra Z2", "notes": "a note",
            "settings": {"algebra": "Z2", "length": 8, "chance": 0.5, "description": "toy sweep"},
            "runs": {"explicit-1l": {"0": run(0.5), "1": run(0.7)}, "implicit": {"0": run(1.0)}}}


def test_tables_give_mean_spread_and_bootstrap_interval_over_seeds():
    text = tables(sweep_results())
    assert "| model | L8 | L32 | L8-p0.5 |" in text
    assert "| explicit-1l (2 seeds) | 0.600 ± 0.141 [0.500, 0.700]" in text  # resampled means: 0.5, 0.6, 0.7
    assert "| implicit (1 seed) | 1.000 |" in text


@pytest.mark.parametrize("p", [0.2, 0.5, None])
def test_no_composition_reference_is_what_copying_scores_on_sampled_words(p):
    # Independently of the formula: on sampled A5 words, a model that is right wherever the prefix
    # holds at most one non-identity element and at chance (1/60) elsewhere.
    words, _ = generate("A5", 4000, 32, p, seed=1)
    easy = np.cumsum(words != 0, axis=1) <= 1
    scored = easy + (1 - easy) / 60
    assert report.no_composition_accuracy(32, p, 60) == pytest.approx(scored.mean(), abs=0.005)
    assert report.no_composition_accuracy(32, p, 60, last=10) == pytest.approx(scored[:, -10:].mean(), abs=0.005)


def test_a_test_set_name_gives_its_length_and_p():
    assert report.parse_set_name("L32") == (32, None)  # at the training p
    assert report.parse_set_name("L8-p0.9") == (8, 0.9)
    assert report.parse_set_name("seq-L128-p0.25-own") == (128, 0.25)


def test_tables_end_with_the_no_composition_reference_for_a_group():
    results = sweep_results()
    results["settings"]["p"] = 0.2  # the training p; the -p0.5 set is at 0.5
    row = [line for line in tables(results).splitlines() if line.startswith("| no composition")]
    assert len(row) == 2  # accuracy and last-10 accuracy, not passes or converged
    copy = {(n, p): f"{report.no_composition_accuracy(n, p, 2):.3f}" for n in (8, 32) for p in (0.2, 0.5)}
    assert row[0] == f"| no composition (reference) | {copy[8, 0.2]} | {copy[32, 0.2]} | {copy[8, 0.5]} |"
    for seeds in results["runs"].values():  # sets tested with each word's own stop keep their p
        for sets in seeds.values():
            sets["L8-p0.5-own"] = sets["L8-p0.5"]
    assert f"| {copy[8, 0.5]} | {copy[8, 0.5]} |" in tables(results)
    results["settings"]["chance"] = None  # a monoid: no reference
    assert "no composition" not in tables(results)


def test_bootstrap_interval_matches_the_exact_resampling_distribution():
    # Means of 3 draws from (0, 0, 1): 0 with probability 8/27, 1/3: 12/27, 2/3: 6/27, 1: 1/27, so the
    # 2.5 % quantile is 0 and the 97.5 % quantile is 1 (26/27 < 0.975).
    assert bootstrap_interval([0.0, 0.0, 1.0]) == (0.0, 1.0)
    values = list(np.random.default_rng(3).normal(0.8, 0.05, 40))
    low, high = bootstrap_interval(values)
    half = 1.96 * np.std(values) / np.sqrt(len(values))  # the normal approximation
    assert abs((high - low) / 2 - half) < 0.1 * half and low < np.mean(values) < high


def test_page_is_rebuilt_from_every_saved_sweep(tmp_path):
    page = tmp_path / "state_tracking.md"
    plots = write_sweep(sweep_results(), tmp_path / "state_tracking", "Z2-L8-ours")
    assert all(p.is_file() and p.read_bytes().startswith(b"\x89PNG") for p in plots)
    other = sweep_results() | {"command": "python tools/research/state_tracking.py --algebra S3"}
    write_sweep(other, tmp_path / "state_tracking", "S3-L8-ours")
    text = write_page(page).read_text()
    assert text.index("## S3-L8-ours") < text.index("## Z2-L8-ours")
    assert "--algebra S3" in text and "![accuracy against length](state_tracking/Z2-L8-ours-accuracy.png)" in text
    assert json.loads((tmp_path / "state_tracking" / "Z2-L8-ours.json").read_text())["runs"]["implicit"]
