"""Checkpoint files are read by the weights-only unpickler: a pickle that would run code is refused by
name and never runs, on resume and on export; trusting it is an explicit opt-in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.integrity import check_tag
from implicit_megatron.checkpoints.layout import MODEL_STATES

ROOT = Path(__file__).resolve().parents[3]


class Payload:
    """Unpickled by the full unpickler, it writes `marker`: the kind of file a checkpoint from
    elsewhere could be."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('the pickle ran')",)


def malicious_tag(folder: Path, marker: Path) -> Path:
    tag = folder / "checkpoints" / "step10"
    tag.mkdir(parents=True)
    states = {"module": {"w": torch.ones(2)}, "dp_world_size": 1, "payload": Payload(marker),
              "config": {"distributed": {"zero_stage": 0}}}
    torch.save(states, tag / MODEL_STATES)
    (tag.parent / "latest").write_text("step10")
    return tag


@pytest.fixture(autouse=True)
def _untrusted():
    yield
    safe_load.set_trust(False)


def test_a_pickle_that_runs_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "marker"
    tag = malicious_tag(tmp_path, marker)
    refused = rf"{tag / MODEL_STATES}: refused to load: it holds the global exec"
    with pytest.raises(safe_load.UnsafeCheckpoint, match=refused):
        safe_load.load(tag / MODEL_STATES)
    with pytest.raises(safe_load.UnsafeCheckpoint, match="checkpoint.trust_pickle=true"):
        check_tag(tag)  # what resume, handoff and export check first
    assert not marker.exists()


@pytest.mark.processes
def test_export_refuses_it_by_name(tmp_path):
    marker = tmp_path / "marker"
    tag = malicious_tag(tmp_path, marker)
    result = subprocess.run([sys.executable, "tools/convert_checkpoint.py", "export", str(tag.parent),
                             str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert f"{tag / MODEL_STATES}: refused to load" in result.stderr and "--trust-checkpoint" in result.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_trusting_is_an_explicit_opt_in(tmp_path):
    marker = tmp_path / "marker"
    tag = malicious_tag(tmp_path, marker)
    safe_load.set_trust(True)
    assert safe_load.load(tag / MODEL_STATES)["dp_world_size"] == 1
    assert marker.read_text() == "the pickle ran"


def test_tensors_and_plain_containers_load(tmp_path):
    state = {"w": torch.arange(6.0).view(2, 3), "step": 3, "groups": [{"lr": 0.1, "betas": (0.9, 0.95)}],
             "name": "x", "none": None}
    torch.save(state, tmp_path / "ok.pt")
    loaded = safe_load.load(tmp_path / "ok.pt")
    assert torch.equal(loaded["w"], state["w"]) and loaded["groups"] == state["groups"]
    safe_load.verify(tmp_path / "ok.pt")
