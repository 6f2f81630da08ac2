"""tools/evaluate.py's results go into the evaluated export's or run's evaluation/ folder: in a folder
from someone else, that folder or a file in it may be a link or a FIFO. It is refused by name before
a model is loaded, so nothing is written through it (nor read from it, nor waited on)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support.tiny_exports import write_tiny_export

from data_pipeline.indexed import megatron_indexed
from implicit_megatron.evaluation.runner import EvalOptions, check_options


@pytest.fixture()
def received(tmp_path):
    """An export with shards to evaluate on, and a file elsewhere that must stay as it is."""
    export = write_tiny_export("mamba2-implicit", tmp_path)
    _, builder_cls = megatron_indexed()
    builder = builder_cls(str(tmp_path / "data_test.bin"), dtype=np.uint16)
    builder.add_document(np.arange(200), [200])
    builder.finalize(str(tmp_path / "data_test.idx"))
    victim = tmp_path / "elsewhere" / "results.json"
    victim.parent.mkdir()
    victim.write_text("not yours\n")
    return export, str(tmp_path / "data"), victim


def options(export, data, **kw) -> EvalOptions:
    return EvalOptions(model=str(export), data=data, tasks=["ppl"], **kw)


def test_an_evaluation_folder_that_is_a_link_is_refused(received):
    export, data, victim = received
    (export / "evaluation").symlink_to(victim.parent)
    with pytest.raises(ValueError, match=f"the results folder {export / 'evaluation'}: .*is a symbolic link"):
        check_options(options(export, data))
    assert victim.read_text() == "not yours\n"


@pytest.mark.parametrize("name", ["results.json", "results.md", "per_position_ppl.png"])
def test_a_results_file_that_is_a_link_is_refused(received, name):
    export, data, victim = received
    (export / "evaluation").mkdir()
    (export / "evaluation" / name).symlink_to(victim)
    with pytest.raises(ValueError, match=f"{export / 'evaluation' / name} is a symbolic link"):
        check_options(options(export, data))


def test_a_fifo_for_results_is_refused_without_waiting_on_it(received):
    export, data, _ = received
    (export / "evaluation").mkdir()
    os.mkfifo(export / "evaluation" / "results.json")
    with pytest.raises(ValueError, match="results.json is not a plain file or folder"):
        check_options(options(export, data))


def test_an_output_folder_you_name_may_be_a_link_but_not_what_it_holds(received, tmp_path):
    export, data, victim = received
    (tmp_path / "mine").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "mine")
    check_options(options(export, data, output=str(tmp_path / "linked")))  # your own link: fine
    (tmp_path / "mine" / "results.json").symlink_to(victim)
    with pytest.raises(ValueError, match=f"--output {tmp_path / 'linked'}: .*results.json is a symbolic link"):
        check_options(options(export, data, output=str(tmp_path / "linked")))
