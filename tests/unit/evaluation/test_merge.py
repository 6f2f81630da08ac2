"""Evaluating into a folder that holds results keeps the earlier tasks of the same evaluation,
replaces another model's, and removes (by name) the plots of tasks no longer in the results."""

from __future__ import annotations

import json

from implicit_megatron.evaluation.merge import merge_into, remove_stale_plots


def results(tasks: dict, source: str = "runs/a/checkpoints", tag: str = "free-step10") -> dict:
    return {"model": {"label": "(24+4)", "source": source, "tag": tag, "solver": {"cap": 96, "tol": 0.05}},
            "data": {"prefix": "data/x", "split": "test", "seed": 1}, "seconds": {t: 1.0 for t in tasks}, **tasks}


def test_the_same_evaluation_keeps_earlier_tasks(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(results({"ppl": {"ppl": 20.0}, "duality": {"match": 1}})))
    lines = []
    merged = merge_into(tmp_path, results({"ppl": {"ppl": 19.0}, "dynamics": {"passes": 3}}), lines.append)
    assert merged["ppl"] == {"ppl": 19.0} and merged["duality"] == {"match": 1} and merged["dynamics"]
    assert set(merged["seconds"]) == {"ppl", "duality", "dynamics"}
    assert lines == [f"{tmp_path / 'results.json'}: kept the earlier duality of this same evaluation"]


def test_another_model_replaces_and_stale_plots_are_named(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(results({"duality": {"match": 1}}, tag="free-step5")))
    (tmp_path / "duality.png").write_bytes(b"png")
    (tmp_path / "per_position_ppl.png").write_bytes(b"png")
    lines = []
    merged = merge_into(tmp_path, results({"extrapolation": {"lengths": {}}}), lines.append)
    assert "duality" not in merged and "replaced" in lines[0]
    remove_stale_plots(tmp_path, merged, lines.append)
    assert not (tmp_path / "duality.png").exists() and (tmp_path / "per_position_ppl.png").exists()
    assert lines[1] == f"removed {tmp_path / 'duality.png'}: its task (duality) is not in these results"
