"""Names that become file names stay plain names."""

from __future__ import annotations

from pathlib import Path

import pytest

from implicit_megatron.checkpoints.layout import find_checkpoint, tag_dir
from implicit_megatron.hf.import_explicit import source_name
from implicit_megatron.utils.names import name_problem


@pytest.mark.parametrize("name", ["bounded", "free-step12", "mamba2-1.3b_implicit", "run.v2", "-x"])
def test_plain_names_pass(name):
    assert name_problem(name) is None


@pytest.mark.parametrize("name", ["", "..", "a/b", "../x", "/abs", ".hidden", "a..b", "a b", "a;b", "a$b", "é"])
def test_names_that_could_become_other_paths_or_shell_words_are_refused(name):
    assert name_problem(name)


def test_a_tag_never_leaves_its_checkpoints_folder(tmp_path):
    (tmp_path / "V" / "free-step3").mkdir(parents=True)
    with pytest.raises(ValueError, match="checkpoint tag '../V/free-step3' may hold only"):
        tag_dir(tmp_path / "run", "../V/free-step3")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("free-step3\n")
    with pytest.raises(ValueError, match="checkpoint tag"):
        find_checkpoint(tmp_path / "run", tag="../../V/free-step3")


def test_an_imported_folders_name_becomes_a_plain_run_name(tmp_path):
    for folder, expected in ((".hidden", "hidden"), ("my model..v2", "my-model.v2"), ("...", "imported")):
        (tmp_path / folder).mkdir()
        assert source_name(Path(tmp_path / folder)) == expected
