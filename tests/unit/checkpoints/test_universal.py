"""Only a universal conversion of our own is loaded: DeepSpeed reads universal checkpoints with the
full unpickler, so a `universal/` folder that the tag's manifest does not vouch for, or that holds a
pickle which would run code, is converted again instead of being loaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from implicit_megatron.checkpoints import universal as conversion
from implicit_megatron.checkpoints.integrity import record_universal, write_manifest
from implicit_megatron.checkpoints.layout import MANIFEST, MODEL_STATES


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
