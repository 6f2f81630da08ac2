"""A tag holds the files its save wrote and nothing else, named as DeepSpeed names them for the saved
precision; whatever DeepSpeed's loaders pick, they unpickle weights-only. Payloads write a marker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support.payloads import WritesMarker

from implicit_megatron import load_config
from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.integrity import check_tag, digest, write_manifest
from implicit_megatron.checkpoints.layout import MANIFEST, MODEL_STATES

ROOT = Path(__file__).resolve().parents[3]
SHARD = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def zero1_tag(folder: Path, precision: str) -> Path:
    cfg = load_config(ROOT / "configs/tiny/mamba2-implicit.yaml", ["distributed.zero_stage=1",
                                                                    f"distributed.precision={precision}"])
    tag = folder / "checkpoints" / "bounded-step4"
    tag.mkdir(parents=True)
    torch.save({"dp_world_size": 1, "config": cfg.to_dict(), "module": {"w": torch.ones(4)}}, tag / MODEL_STATES)
    torch.save({"torch": torch.get_rng_state()}, tag / "rng_rank0.pt")
    prefix = "bf16_" if precision == "bf16" else ""
    torch.save({"optimizer_state_dict": {"zero_stage": 1}}, tag / f"{prefix}{SHARD}")
    write_manifest(tag)
    return tag


def relist(tag: Path) -> None:
    """The manifest rewritten over whatever the tag now holds: what whoever planted files would do."""
    manifest = json.loads((tag / MANIFEST).read_text())
    manifest["files"] = {p.name: {"size": p.stat().st_size, "digest": digest(p)}
                         for p in tag.iterdir() if p.name != MANIFEST}
    (tag / MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture(autouse=True)
def _untrusted():
    yield
    safe_load.set_trust(False)


@pytest.mark.parametrize("planted", ["zz_model_states.pt", "a_optim_states.pt", "notes.txt"])
def test_a_file_the_save_did_not_write_is_refused_by_name(planted, tmp_path):
    tag = zero1_tag(tmp_path, "bf16")
    check_tag(tag)
    (tag / planted).write_bytes(b"anything")
    for listed in (False, True):  # the manifest does not vouch for it; nor does one rewritten to list it
        if listed:
            relist(tag)
        with pytest.raises(safe_load.UnsafeCheckpoint, match=rf"{tag / planted}: refused: not one of the files"):
            check_tag(tag, crc=False)


def test_an_fp32_tag_checks_the_unprefixed_shards_deepspeed_loads(tmp_path):
    """An fp32 engine loads `zero_pp_rank_*`: a payload there, beside a copy of the real shard under
    the bf16 name (first alphabetically) and a manifest listing both, is refused, and never runs."""
    marker = tmp_path / "marker"
    tag = zero1_tag(tmp_path, "fp32")
    shutil.copy(tag / SHARD, tag / f"bf16_{SHARD}")
    torch.save({"optimizer_state_dict": WritesMarker(marker)}, tag / SHARD)
    relist(tag)
    with pytest.raises(safe_load.UnsafeCheckpoint):
        check_tag(tag)
    (tag / f"bf16_{SHARD}").unlink()
    relist(tag)
    with pytest.raises(safe_load.UnsafeCheckpoint, match=rf"{tag / SHARD}: refused to load: it holds the global"):
        check_tag(tag)
    assert not marker.exists()


def test_deepspeeds_loaders_unpickle_weights_only_inside_weights_only_loads(tmp_path):
    """DeepSpeed's consolidation asks torch for the full unpickler; inside weights_only_loads it gets
    the weights-only one, whichever file it globbed."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    marker = tmp_path / "marker"
    tag = tmp_path / "step4"
    tag.mkdir()
    torch.save({"buffer_names": [], "x": WritesMarker(marker)}, tag / MODEL_STATES)
    torch.save({"optimizer_state_dict": {"zero_stage": 1}}, tag / SHARD)
    refused = pytest.raises(safe_load.UnsafeCheckpoint, match=rf"{tag / MODEL_STATES}: refused to load")
    with refused, safe_load.weights_only_loads():
        get_fp32_state_dict_from_zero_checkpoint(str(tmp_path), tag="step4")
    assert not marker.exists() and torch.load is safe_load._torch_load  # restored after
    torch.load(tag / MODEL_STATES, weights_only=False)  # the payload is armed: the full unpickler runs it
    assert marker.read_text() == "the pickle ran"
