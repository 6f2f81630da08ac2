"""`tools/evaluate.py --run FOLDER` logs into the store the run folder's saved config names: a folder
from someone else could name a server of theirs (the results would be sent there) or a store
elsewhere on this machine. Such a store is used only where you name it yourself."""

from __future__ import annotations

import pytest

from implicit_megatron.evaluation.mlflow_results import destination


def run_folder(tmp_path, uri: str | None):
    folder = tmp_path / "run"
    folder.mkdir()
    tracking = f"  uri: {uri}\n" if uri else ""
    (folder / "config.yaml").write_text(f"name: run\ntracking:\n{tracking}  experiment: theirs\n")
    return folder


@pytest.mark.parametrize("uri", ["http://sender.example:5000", "sqlite:////tmp/elsewhere/theirs.db",
                                 "file:///tmp/elsewhere/mlruns"])
def test_a_store_outside_the_folder_is_refused_unless_you_name_it(uri, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder = run_folder(tmp_path, uri)
    with pytest.raises(ValueError, match=f"^{folder / 'config.yaml'}: tracking.uri '{uri}' is a store outside"):
        destination(folder)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert destination(folder) == (uri, "theirs", False)


@pytest.mark.parametrize("named", [False, True])
def test_the_folders_own_store_is_used(named, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    own = f"sqlite:///{(tmp_path / 'run' / 'mlflow.db').resolve()}"
    folder = run_folder(tmp_path, own if named else None)
    assert destination(folder) == (own, "theirs", True)


def test_a_saved_config_that_would_expand_without_end_is_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text("a: &a [x, x]\nb: &b [*a, *a]\ntracking: {}\n")
    with pytest.raises(ValueError, match="not the config a run saved"):
        destination(folder)
