"""A checkpoint tag is complete only when every rank's files are there and read back intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from implicit_megatron import load_config
from implicit_megatron.checkpoints.integrity import check_tag, fallback_hint, newest_complete
from implicit_megatron.checkpoints.layout import DamagedCheckpoint, read_latest

ROOT = Path(__file__).resolve().parents[3]


def write_tag(folder: Path, tag: str, world: int = 2, stage: int = 1) -> Path:
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", [f"distributed.zero_stage={stage}"])
    path = folder / tag
    path.mkdir(parents=True)
    torch.save({"dp_world_size": world, "config": cfg.to_dict(), "module": {"w": torch.randn(4096)}},
               path / "mp_rank_00_model_states.pt")
    for rank in range(world):
        torch.save({"torch": torch.get_rng_state()}, path / f"rng_rank{rank}.pt")
        torch.save({"state": torch.randn(2048)}, path / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (folder / "latest").write_text(tag + "\n")
    return path


def test_a_complete_tag_passes_and_every_kind_of_damage_is_named(tmp_path):
    tag = write_tag(tmp_path, "bounded-step4")
    check_tag(tag)
    states = tag / "mp_rank_00_model_states.pt"
    data = states.read_bytes()

    states.write_bytes(data[: len(data) // 2])  # cut short: a full disk, an interrupted copy
    with pytest.raises(DamagedCheckpoint, match="mp_rank_00_model_states.pt: does not read back") as info:
        check_tag(tag)
    assert "incomplete or corrupt" in str(info.value) and info.value.file == states

    middle = len(data) // 2
    states.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:])
    with pytest.raises(DamagedCheckpoint, match="CRC"):
        check_tag(tag)
    check_tag(tag, crc=False)  # the structure alone is intact: only the checksum sees flipped bytes

    states.write_bytes(data)
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()  # a rank's shard never written
    with pytest.raises(DamagedCheckpoint, match="zero_pp_rank_1_mp_rank_00_optim_states.pt: is missing"):
        check_tag(tag)


def test_the_newest_complete_tag_and_the_hint_name_the_previous_one(tmp_path):
    write_tag(tmp_path, "bounded-step4")
    newest = write_tag(tmp_path, "free-step10")
    write_tag(tmp_path, "bounded-step8")
    (tmp_path / "free-step12").mkdir()  # a kill mid-save left a partial folder
    assert read_latest(tmp_path) == "bounded-step8"
    (newest / "rng_rank0.pt").write_bytes(b"")
    tag, damaged = newest_complete(tmp_path)
    assert tag == "bounded-step8" and [d.file.parent.name for d in damaged] == ["free-step12", "free-step10"]
    assert "previous complete checkpoint is" in fallback_hint(tmp_path, "free-step10")
    assert fallback_hint(tmp_path, "free-step10").endswith("(--tag bounded-step8)")
    assert "no complete checkpoint older than bounded-step4" in fallback_hint(tmp_path, "bounded-step4")


def test_a_latest_with_stray_bytes_is_refused_by_name(tmp_path):
    assert read_latest(tmp_path) is None
    (tmp_path / "latest").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DamagedCheckpoint) as info:
        read_latest(tmp_path)
    assert str(info.value) == f"{tmp_path / 'latest'}: does not hold a checkpoint tag name"  # not 'the checkpoint
    # checkpoints': `latest` is no tag's file
    with pytest.raises(DamagedCheckpoint) as info:
        check_tag(tmp_path / "free-step9")  # a tag `latest` could name that is not there
    assert str(info.value) == (f"{tmp_path / 'free-step9'}: is missing; the checkpoint free-step9 is incomplete or "
                               "corrupt")


def test_the_manifest_names_a_truncated_changed_swapped_or_unlisted_file(tmp_path):
    from implicit_megatron.checkpoints.integrity import write_manifest
    from implicit_megatron.checkpoints.layout import MANIFEST

    tag = write_tag(tmp_path, "bounded-step4")
    write_manifest(tag)
    check_tag(tag)
    listed = (tag / MANIFEST).read_text()
    assert '"mp_rank_00_model_states.pt"' in listed and '"rng_rank1.pt"' in listed
    shard = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = shard.read_bytes()

    shard.write_bytes(data[:-10])
    with pytest.raises(DamagedCheckpoint, match=rf"{shard.name}: is {len(data) - 10} bytes, the manifest says"):
        check_tag(tag, crc=False)  # sizes are checked without reading a byte
    # a whole, valid file of the same size from another checkpoint: its zip directory differs
    other = write_tag(tmp_path / "other", "bounded-step4") / shard.name
    assert other.stat().st_size == len(data)
    shard.write_bytes(other.read_bytes())
    with pytest.raises(DamagedCheckpoint, match=rf"{shard.name}: does not match its checksum in the manifest"):
        check_tag(tag, crc=False)  # the manifest's digest needs the directory only
    # bytes changed in the data: the full check reads them against the CRC-32s the digest covers
    start = len(data) // 2  # inside the tensor's record
    shard.write_bytes(data[:start] + bytes(b ^ 0xFF for b in data[start:start + 16]) + data[start + 16:])
    check_tag(tag, crc=False)
    with pytest.raises(DamagedCheckpoint, match=rf"{shard.name}: does not read back"):
        check_tag(tag)

    shard.write_bytes(data)
    check_tag(tag)
    manifest = json.loads((tag / MANIFEST).read_text())
    del manifest["files"]["rng_rank1.pt"]
    (tag / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DamagedCheckpoint, match="rng_rank1.pt: is not in the checkpoint's manifest"):
        check_tag(tag)


def test_weights_that_are_not_finite_make_a_tag_damaged_and_the_run_falls_back(tmp_path):
    """A tag whose weights hold NaN trains nothing (every step is skipped): it is refused by name, and
    the newest tag with finite weights is the one to resume from."""
    write_tag(tmp_path, "bounded-step4")
    poisoned = write_tag(tmp_path, "bounded-step8")
    states = torch.load(poisoned / "mp_rank_00_model_states.pt", weights_only=False)
    states["module"]["w"][[3, 7, 11]] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    torch.save(states, poisoned / "mp_rank_00_model_states.pt")
    with pytest.raises(DamagedCheckpoint, match=r"model_states.pt: holds values that are not finite \(NaN or inf\) "
                                                 r"in module.w \(3 of 4096 values\)"):
        check_tag(poisoned)
    check_tag(poisoned, crc=False)  # the quick check reads no tensor data
    chosen, damaged = newest_complete(tmp_path)
    assert chosen == "bounded-step4" and len(damaged) == 1 and "module.w" in str(damaged[0])


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    import torch.distributed as dist
    from support.processes import free_port

    from implicit_megatron.train.checkpointer import CheckpointSaveError, refuse_nonfinite_weights

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        write_tag(tmp_path, "step4")
        refuse_nonfinite_weights(module, tmp_path, "step6")
        with torch.no_grad():
            module[1].bias[0] = float("nan")
        with pytest.raises(CheckpointSaveError, match=r"checkpoint step6 not saved: the weights hold values that are "
                                                      r"not finite \(NaN or inf\) \(1.bias on rank 0\); 'latest' "
                                                      r"still names .*step4"):
            refuse_nonfinite_weights(module, tmp_path, "step6")
    finally:
        dist.destroy_process_group()
