"""The markdown tables follow the paper's column layout."""

from __future__ import annotations

import pytest

from implicit_megatron.evaluation import report
from implicit_megatron.evaluation.mlflow_results import flat_metrics

RESULTS = {
    "model": {"label": "m (24+4)", "source": "runs/m/checkpoints",
              "solver": {"implicit": True, "phase": "free", "label": "(24+4)", "cap": 96, "tol": 0.05}},
    "data": {"prefix": "data/x", "split": "test"},
    "ppl": {"seq_len": 2048, "ppl": 12.861, "nll": 2.554},
    "lm_eval": {"tasks": {"piqa": {"acc": 0.6, "acc_norm": 0.61}, "lambada_openai": {"perplexity": 18.03, "acc": 0.4},
                          "local_task": {"exact_match": 0.5}}},
    "extrapolation": {"lengths": {"4096": {"ppl": 12.5}, "2048": {"ppl": 12.86}}},
}


def test_main_table_has_the_papers_columns_in_order_and_averages_accuracies():
    lines = report.main_table("m (24+4)", RESULTS).splitlines()
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    assert headers == ["Model", "Test ppl↓ (2048)", "LAMBADA ppl↓", "LAMBADA acc↑", "PIQA acc↑",
                       "local_task exact_match", "Average acc↑"]
    assert lines[2].split("|")[-2].strip() == "0.5000"  # (0.4 + 0.6) / 2


def test_lengths_are_sorted_numerically_and_metrics_are_flat():
    assert "| m (24+4) | 12.86 | 12.50 |" in report.lengths_table("m (24+4)", RESULTS["extrapolation"])
    metrics = flat_metrics(RESULTS)
    assert metrics["eval/ppl"] == 12.861 and metrics["eval/piqa/acc_norm"] == pytest.approx(0.61)
    assert metrics["eval/ppl_4096"] == 12.5
    assert "phase free, (24+4), at most 96 passes, tolerance 0.05" in report.render(RESULTS)
