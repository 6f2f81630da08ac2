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


@pytest.mark.parametrize("store", ["a dangling link", "a link to another store", "a FIFO", "garbage"])
@pytest.mark.timeout(60)  # a FIFO opened would wait for ever
def test_a_run_folders_store_that_is_not_its_own_file_is_refused_unopened(store, tmp_path, monkeypatch):
    import os

    from implicit_megatron.evaluation.mlflow_results import check_destination

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder = run_folder(tmp_path, None)
    db, other = folder / "mlflow.db", tmp_path / "other.db"
    other.write_bytes(b"theirs")
    if store == "a dangling link":
        db.symlink_to(tmp_path / "missing.db")
    elif store == "a link to another store":
        db.symlink_to(other)
    elif store == "a FIFO":
        os.mkfifo(db)
    else:
        db.write_bytes(b"\x00garbage" * 100)
    why = {"a FIFO": "it is not a regular file", "garbage": "file is not a database"}.get(store,
                                                                                         "it is a symbolic link")
    with pytest.raises(ValueError, match=f"^{db}: not an MLflow store results can be logged to \\(.*{why}"):
        check_destination(folder)
    assert other.read_bytes() == b"theirs" and not (tmp_path / "missing.db").exists()
