"""Only a universal conversion of our own is loaded: DeepSpeed reads universal checkpoints with the
full unpickler, so a `universal/` folder that the tag's manifest does not vouch for, that holds a
pickle which would run code, or a link to files from elsewhere, is converted again instead of being
loaded. The conversion reads the tag's own files only, with the weights-only unpickler."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints import universal as conversion
from implicit_megatron.checkpoints.integrity import check_tag, digest, record_universal, write_manifest
from implicit_megatron.checkpoints.layout import MANIFEST, MODEL_STATES, UNIVERSAL_TMP


class WritesMarker:
    """Unpickled by the full unpickler, it writes a file: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "code ran")


def tag_with_universal(tmp_path: Path, payload) -> tuple[Path, Path]:
    tag = tmp_path / "checkpoints" / "bounded-step8"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}}, tag / MODEL_STATES)
    write_manifest(tag)
    universal = tag / conversion.UNIVERSAL
    (universal / "zero" / "w").mkdir(parents=True)
    torch.save(payload, universal / "zero" / "w" / "fp32.pt")
    torch.save({"step": 8}, universal / MODEL_STATES)
    return tag, universal


def our_conversion(path: Path, out: Path, workers: int) -> None:
    (out / "zero" / "w").mkdir(parents=True)
    torch.save({"param": torch.ones(2)}, out / "zero" / "w" / "fp32.pt")
    torch.save({"step": 8}, out / MODEL_STATES)


def test_a_crafted_universal_folder_is_converted_again_not_loaded(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setattr(conversion, "_convert", our_conversion)
    for forged in (False, True):  # not in the manifest; listed in it by whoever planted it
        tag, universal = tag_with_universal(tmp_path / str(forged), {"param": WritesMarker(marker)})
        if forged:
            record_universal(tag, universal)
        said = []
        assert conversion.to_universal(tag, log=said.append) == universal
        assert not marker.exists()
        assert torch.equal(torch.load(universal / "zero" / "w" / "fp32.pt", weights_only=True)["param"],
                           torch.ones(2))  # our conversion replaced it
        assert len(said) == 1 and f"{universal}: not used: " in said[0]
        assert ("would run code when loaded" if forged else "does not record it") in said[0]
        assert set(json.loads((tag / MANIFEST).read_text())["universal"]) == {"zero/w/fp32.pt", MODEL_STATES}
    planted = tmp_path / "planted.pt"
    torch.save({"param": WritesMarker(marker)}, planted)
    torch.load(planted, weights_only=False)  # the payload is armed: a full load runs it
    assert marker.read_text() == "code ran"


def test_a_vouched_conversion_is_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(conversion, "_convert", our_conversion)
    tag = tmp_path / "bounded-step8"
    tag.mkdir()
    torch.save({"module": {}}, tag / MODEL_STATES)
    write_manifest(tag)
    universal = conversion.to_universal(tag)

    def refuse(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(conversion, "_convert", refuse)
    assert conversion.to_universal(tag, log=refuse) == universal
    torch.save({"param": torch.zeros(2)}, universal / "zero" / "w" / "fp32.pt")  # changed after conversion
    monkeypatch.setattr(conversion, "_convert", our_conversion)
    said = []
    conversion.to_universal(tag, log=said.append)
    assert len(said) == 1 and "zero/w/fp32.pt changed since its conversion" in said[0]


def test_a_linked_folder_inside_universal_is_not_vouched_for(tmp_path, monkeypatch):
    """A folder of crafted pickles linked into `universal/`, and the manifest recorded again: the link
    itself is what the conversion refuses, and the run's own conversion replaces the folder."""
    marker = tmp_path / "marker"
    monkeypatch.setattr(conversion, "_convert", our_conversion)
    tag, universal = tag_with_universal(tmp_path, {"param": torch.ones(2)})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    torch.save({"param": WritesMarker(marker)}, elsewhere / "fp32.pt")
    shutil.rmtree(universal / "zero" / "w")
    (universal / "zero" / "w").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(safe_load.UnsafeCheckpoint, match=r"zero/w is a symbolic link"):
        record_universal(tag, universal)  # what re-recording the manifest would have vouched for
    manifest = json.loads((tag / MANIFEST).read_text())  # as a planter would write it by hand
    manifest["universal"] = {MODEL_STATES: {"size": (universal / MODEL_STATES).stat().st_size,
                                            "digest": digest(universal / MODEL_STATES)}}
    (tag / MANIFEST).write_text(json.dumps(manifest))
    said = []
    conversion.to_universal(tag, log=said.append)
    assert len(said) == 1 and "zero/w is a symbolic link" in said[0]
    assert not (universal / "zero" / "w").is_symlink() and (elsewhere / "fp32.pt").is_file()
    assert not marker.exists()


def test_a_link_anywhere_in_a_tag_is_refused_by_name(tmp_path):
    tag = tmp_path / "checkpoints" / "step8"
    tag.mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, tmp_path / "rng_elsewhere.pt")
    (tag / "rng_rank0.pt").symlink_to(tmp_path / "rng_elsewhere.pt")
    with pytest.raises(safe_load.UnsafeCheckpoint, match=rf"{tag / 'rng_rank0.pt'} is a symbolic link"):
        check_tag(tag)
    linked = tmp_path / "checkpoints" / "step9"
    linked.symlink_to(tag, target_is_directory=True)
    with pytest.raises(safe_load.UnsafeCheckpoint, match=rf"{linked} is a symbolic link"):
        check_tag(linked)


def two_rank_tag(folder: Path, planted_marker: Path) -> Path:
    """The files of a 2-rank ZeRO-1 tag (model states, rng, optimizer shards), and a third optimizer
    shard planted beside them that runs code when the full unpickler reads it."""
    tag = folder / "step4"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "dp_world_size": 2, "config": {"distributed": {"zero_stage": 1}}},
               tag / MODEL_STATES)
    for rank in range(2):
        torch.save({"cpu": torch.zeros(2)}, tag / f"rng_rank{rank}.pt")
        torch.save({"optimizer_state_dict": {"step": 4}}, tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    planted = tag / "zero_pp_rank_2_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": WritesMarker(planted_marker)}, planted)
    return tag


@pytest.mark.processes
def test_the_converter_reads_only_the_tags_own_files_and_those_weights_only(tmp_path):
    marker = tmp_path / "marker"
    tag = two_rank_tag(tmp_path / "checkpoints", marker)
    staged = tmp_path / "staged"
    conversion._stage_own_files(tag, staged)
    assert sorted(p.name for p in staged.iterdir()) == sorted(
        [MODEL_STATES, "rng_rank0.pt", "rng_rank1.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
         "zero_pp_rank_1_mp_rank_00_optim_states.pt"])
    with pytest.raises(RuntimeError, match="conversion to a universal checkpoint failed"):
        conversion._convert(tag, tmp_path / "out", workers=1)  # the real converter, on files it cannot convert
    assert not marker.exists() and not (tmp_path / "checkpoints" / ".step4.conversion-input").exists()

    # and a file it does read, holding code: refused by the weights-only load, where DeepSpeed's own runs it
    torch.save({"optimizer_state_dict": WritesMarker(marker)}, staged / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    torch.save({"module": {}, "dp_world_size": 2, "payload": WritesMarker(marker)}, staged / MODEL_STATES)
    result = subprocess.run([sys.executable, "-m", "implicit_megatron.checkpoints.weights_only_convert",
                             "--input_folder", str(staged), "--output_folder", str(tmp_path / "out2")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "refused to load: it holds the global" in result.stderr
    assert not marker.exists()
    torch.load(staged / MODEL_STATES, weights_only=False)  # the payload is armed
    assert marker.read_text() == "code ran"


@pytest.mark.processes  # the real converter runs (and fails on these files)
def test_the_conversions_working_folders_left_as_links_are_removed_not_followed(tmp_path, monkeypatch):
    """A received tag may bring `.TAG.conversion-input` and `universal/`'s temporary folder as links
    to folders elsewhere: the conversion removes the links and writes nothing through them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("theirs")
    tag = two_rank_tag(tmp_path / "checkpoints", tmp_path / "marker")
    (tag.parent / f".{tag.name}.conversion-input").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RuntimeError, match="conversion to a universal checkpoint failed"):
        conversion._convert(tag, tmp_path / "out", workers=1)  # staged its own files, not into `outside`
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not os.path.lexists(tag.parent / f".{tag.name}.conversion-input")

    received, universal = tag_with_universal(tmp_path / "received", {"param": torch.ones(2)})
    shutil.rmtree(universal)
    (received / UNIVERSAL_TMP).symlink_to(outside, target_is_directory=True)
    monkeypatch.setattr(conversion, "_convert", our_conversion)
    assert conversion.to_universal(received) == universal and (universal / "zero" / "w" / "fp32.pt").is_file()
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
