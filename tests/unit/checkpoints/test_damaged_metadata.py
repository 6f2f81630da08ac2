"""A run's checkpoint metadata damaged on disk (held.json, run_id, latest) is named in one line, and
the run goes on where it safely can; the messages say what is true."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from implicit_megatron import load_config
from implicit_megatron.checkpoints.layout import HELD, RUN_ID, DamagedCheckpoint, own_run_id, prune, read_latest

ROOT = Path(__file__).resolve().parents[3]


def tags(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).mkdir(parents=True)


@pytest.mark.parametrize("damage", ['{"bounded-step2": 5}', '{"../x": {"why": "?"}}', "[1, 2]", "\xff{"])
def test_a_damaged_hold_list_is_moved_aside_with_a_warning_and_this_save_prunes_nothing(damage, tmp_path):
    tags(tmp_path, "bounded-step2", "bounded-step4", "bounded-step6")
    (tmp_path / HELD).write_bytes(damage.encode("latin-1"))
    said = []
    prune(tmp_path, keep_last=1, latest="bounded-step6", log=said.append)
    aside = sorted(tmp_path.glob(f"{HELD}.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damage.encode("latin-1") and not (tmp_path / HELD).exists()
    assert len(said) == 1 and f"{tmp_path / HELD} is not a list of held checkpoints" in said[0] and str(aside[0]) \
        in said[0]
    assert sorted(p.name for p in tmp_path.glob("bounded-*")) == ["bounded-step2", "bounded-step4", "bounded-step6"]
    prune(tmp_path, keep_last=1, latest="bounded-step6", log=said.append)  # the next save prunes as usual
    assert sorted(p.name for p in tmp_path.glob("bounded-*")) == ["bounded-step6"] and len(said) == 1


@pytest.mark.parametrize("damage", [b"", b"\xff\xfe\x00", b"not-an-id\n"])
def test_a_damaged_run_id_is_taken_from_the_newest_checkpoint_with_a_warning(damage, tmp_path):
    ours = "0123456789abcdef0123456789abcdef"
    (tmp_path / RUN_ID).write_bytes(damage)
    said = []
    assert own_run_id(tmp_path, adopt=ours, log=said.append) == ours
    assert (tmp_path / RUN_ID).read_text() == ours + "\n"
    assert len(said) == 1 and f"{tmp_path / RUN_ID} does not hold a run id" in said[0] and ours in said[0]
    assert own_run_id(tmp_path, log=said.append) == ours and len(said) == 1


def test_a_latest_that_is_a_folder_is_named_as_such(tmp_path):
    (tmp_path / "latest").mkdir()
    with pytest.raises(DamagedCheckpoint, match=r"latest: is not a file"):
        read_latest(tmp_path)


def test_latest_naming_a_missing_tag_with_newer_complete_ones_says_so(tmp_path):
    """`latest` names an older tag that is gone while newer complete ones exist: the message names
    them (it once said that no complete checkpoint existed)."""
    import torch

    from implicit_megatron.train.handoff import resume_tag

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", [f"train.output_dir={tmp_path}"])
    folder = tmp_path / "checkpoints"
    tag = folder / "bounded-step8"
    tag.mkdir(parents=True)
    torch.save({"dp_world_size": 1, "config": cfg.to_dict(), "module": {"w": torch.ones(2)}},
               tag / "mp_rank_00_model_states.pt")
    torch.save({"torch": torch.get_rng_state()}, tag / "rng_rank0.pt")
    (folder / "latest").write_text("bounded-step4\n")
    with pytest.raises(DamagedCheckpoint) as err:
        resume_tag(cfg, print)
    assert "no complete checkpoint older than bounded-step4" in str(err.value)
    assert "the newest: bounded-step8" in str(err.value) and "point" in str(err.value)
    assert json.dumps(str(err.value))  # one line


def test_a_tag_pruned_while_it_is_read_is_named_as_such(tmp_path, monkeypatch):
    """An evaluation reads a tag that the running training prunes meanwhile: not 'incomplete or
    corrupt' (nothing is damaged) but removed, and why."""
    import shutil

    import torch

    from implicit_megatron.hf import export

    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", ["distributed.zero_stage=0",
                                                                    "distributed.precision=fp32"])
    tag = tmp_path / "checkpoints" / "bounded-step4"
    tag.mkdir(parents=True)
    torch.save({"dp_world_size": 1, "config": cfg.to_dict(), "module": {"w": torch.ones(2)}},
               tag / "mp_rank_00_model_states.pt")
    torch.save({"torch": torch.get_rng_state()}, tag / "rng_rank0.pt")
    (tmp_path / "checkpoints" / "latest").write_text("bounded-step4\n")

    def pruned_meanwhile(path, saved):
        shutil.rmtree(path)
        raise FileNotFoundError(2, "No such file or directory", str(path / "mp_rank_00_model_states.pt"))

    monkeypatch.setattr(export, "consolidated_weights", pruned_meanwhile)
    with pytest.raises(FileNotFoundError, match=r"bounded-step4: removed while it was being read \(a training"):
        export.read_checkpoint(tmp_path / "checkpoints")
