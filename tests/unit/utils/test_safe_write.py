"""A run folder's files are written without following links: a link in a file's place is replaced,
an append through one is refused by name, and what the link pointed to is never touched."""

from __future__ import annotations

import os

import pytest

from implicit_megatron.checkpoints.layout import write_latest
from implicit_megatron.tracking.metrics_file import append_metrics, drop_metrics_after
from implicit_megatron.utils.own_files import foreign_entry_inside
from implicit_megatron.utils.safe_write import open_append, replace_text


def linked(tmp_path, name: str):
    victim = tmp_path / "outside" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_text("theirs\n")
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / name).symlink_to(victim)
    return run, victim


def test_a_replaced_file_replaces_a_link_and_keeps_readable_permissions(tmp_path):
    run, victim = linked(tmp_path, "config.yaml")
    replace_text(run / "config.yaml", "ours\n")
    assert victim.read_text() == "theirs\n" and not (run / "config.yaml").is_symlink()
    assert (run / "config.yaml").read_text() == "ours\n"
    umask = os.umask(0)
    os.umask(umask)
    assert (run / "config.yaml").stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]  # no temporary file left


def test_latest_and_metrics_never_write_through_a_link(tmp_path):
    run, victim = linked(tmp_path, ".latest.tmp")  # the fixed temporary name `latest` was once written under
    write_latest(run, "bounded-step4")
    assert victim.read_text() == "theirs\n" and (run / "latest").read_text() == "bounded-step4\n"
    run, victim = linked(tmp_path, "metrics.jsonl")
    with pytest.raises(OSError, match=r"metrics.jsonl is a symbolic link"):
        append_metrics(run, 5, {"train/loss": 1.0})
    drop_metrics_after(run, 0)  # reads through it (a read harms nothing) and writes its own file in its place
    assert victim.read_text() == "theirs\n"
    with open_append(tmp_path / "plain.jsonl") as handle:
        handle.write("x\n")


def test_the_run_folder_may_be_a_link_but_hold_none(tmp_path):
    real = tmp_path / "disk" / "run"
    (real / "checkpoints").mkdir(parents=True)
    (tmp_path / "run").symlink_to(real)  # a run kept on another disk
    assert foreign_entry_inside(tmp_path / "run") is None
    (real / "checkpoints" / "zero_to_fp32.py").symlink_to(tmp_path / "elsewhere.py")
    assert "checkpoints/zero_to_fp32.py is a symbolic link" in foreign_entry_inside(tmp_path / "run")


def test_a_hard_linked_file_is_foreign_to_a_run_folder_except_in_a_conversions_staging(tmp_path):
    import os

    run = tmp_path / "run"
    (run / "checkpoints" / ".step4.conversion-input").mkdir(parents=True)
    (run / "checkpoints" / "step4").mkdir()
    (run / "checkpoints" / "step4" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    os.link(run / "checkpoints" / "step4" / "mp_rank_00_model_states.pt",
            run / "checkpoints" / ".step4.conversion-input" / "mp_rank_00_model_states.pt")
    assert foreign_entry_inside(run) is None  # symbolic links and the like only, by default
    found = foreign_entry_inside(run, hard_links=True)
    assert found and "step4/mp_rank_00_model_states.pt is hard-linked (its data has 2 names" in found
    assert ".conversion-input" not in found
    (run / "checkpoints" / "step4" / "mp_rank_00_model_states.pt").unlink()
    assert foreign_entry_inside(run, hard_links=True) is None
    (run / "metrics.jsonl").write_text("{}\n")
    os.link(run / "metrics.jsonl", tmp_path / "elsewhere.jsonl")
    assert "run/metrics.jsonl is hard-linked" in foreign_entry_inside(run, hard_links=True)
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")  # a file of the run folder itself, not below a subfolder
    assert "run/metrics.jsonl is not a plain file or folder" in foreign_entry_inside(run)
