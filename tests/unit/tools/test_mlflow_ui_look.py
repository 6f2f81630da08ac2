"""tools/dev/mlflow_ui_look.py: what it counts as a page lacking, and a folder it cannot read refused
by name (the browser part needs Chromium, which the suite does not install)."""

from __future__ import annotations

import pytest
from support.tools import load_tool

look = load_tool("mlflow_ui_look")


def test_a_page_lacks_what_it_does_not_show_and_must_not_show_genai_s_side_bar():
    training_view = "implicit-megatron › Runs\nCreated by\nroot\nModel training"
    assert look.missing_text(training_view, ["Created by", "Datasets"]) == ["Datasets"]
    genai_view = training_view + "\nEvaluation runs\nJudges"
    assert look.missing_text(genai_view, ["Created by"]) == ["(GenAI view) Evaluation runs", "(GenAI view) Judges"]


def test_a_folder_without_a_local_store_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        look.main([str(tmp_path), "--out", str(tmp_path / "shots")])
    assert stop.value.code == 2
    assert f"{tmp_path / 'mlflow.db'} is missing" in capsys.readouterr().err
    assert not (tmp_path / "shots").exists()
