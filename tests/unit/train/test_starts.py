"""The kinds of start from a checkpoint (train/starts.py): a closed set of classes, each choosing
itself and loading itself; rank 0's choice of tag travels to every rank as a typed record; a new
kind is one class (defined here, in the test, and chosen and loaded by the trainer's checkpointer)."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from support.fake_checkpoints import fake_checkpoint
from support.processes import free_port

from implicit_megatron import build_model, load_config
from implicit_megatron.checkpoints import safe_load
from implicit_megatron.train.checkpointer import Checkpointer
from implicit_megatron.train.handoff import OwnStart, StartContext, read_own_start
from implicit_megatron.train.progress import Progress
from implicit_megatron.train.starts import Native, Start, Universal, WeightsFirst, find_source

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "configs/tiny/mamba2-implicit.yaml")


@pytest.fixture
def kinds(monkeypatch):
    """Start.KINDS as it is, restored after the test: a kind a test defines leaves with it."""
    monkeypatch.setattr(Start, "KINDS", list(Start.KINDS))
    return Start.KINDS


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_kinds_are_a_closed_set_asked_in_order_and_built_with_keywords():
    assert [kind.how for kind in Start.KINDS] == ["pretrained", "weights", "native", "universal"]
    assert [kind.how for kind in Start.KINDS if kind.loads_universal] == ["universal"]  # what the engine is told
    with pytest.raises(TypeError):
        Native(Path("checkpoints"), "step8", True)  # type: ignore[misc]  # no positional booleans


def test_each_start_names_itself_in_the_log_as_launch_scripts_read_it(tmp_path):
    tag = fake_checkpoint(tmp_path, "bounded-step8", 2, 2)

    def start(world: int, *overrides: str) -> Start:
        cfg = load_config(TINY, [f"train.output_dir={tmp_path}", *overrides])
        return find_source(cfg, world, "bounded-step8")

    resume = start(2, "distributed.zero_stage=2", "curriculum.run_phase=bounded")
    assert resume.describe() == f"{tag} (resume, native)" and not resume.loads_universal
    handoff = start(1, "distributed.zero_stage=3", "curriculum.run_phase=free")
    assert isinstance(handoff, Universal) and handoff.loads_universal
    assert handoff.describe() == f"{tag} (handoff/load, universal)"
    weights = start(1, "distributed.zero_stage=3", "curriculum.run_phase=free", "checkpoint.load_optimizer=false")
    assert weights.describe() == f"{tag} (handoff/load, weights)" and not weights.loads_universal


def test_rank_zeros_choice_is_a_typed_record_with_the_tag_the_run_id_or_the_error(tmp_path):
    cfg = load_config(TINY, [f"train.output_dir={tmp_path}"])
    fresh = read_own_start(cfg, print)
    assert fresh.tag is None and fresh.error is None and re.fullmatch(r"[0-9a-f]{32}", str(fresh.run_id))
    fake_checkpoint(tmp_path, "bounded-step8", 1, 0, client={"step": 8, "run_id": fresh.run_id})
    chosen = read_own_start(cfg, print)
    assert chosen == OwnStart(tag="bounded-step8", run_id=fresh.run_id)
    assert pickle.loads(pickle.dumps(chosen)) == chosen  # as broadcast_object_list sends it
    fake_checkpoint(tmp_path, "bounded-step9", 1, 0, client={"step": 9, "run_id": "0" * 32})  # `latest` names it
    refused = read_own_start(cfg, print)
    assert refused.tag is None and "bounded-step9: was saved by another run" in str(refused.error)


def test_a_new_kind_of_start_is_one_class(kinds, one_process_group, tmp_path):
    """A start from one file of fp32 weights (torch.save of a state dict), defined here and nowhere
    else: find_source asks it, the checkpointer loads it, the engine is told what it says."""

    class StateDictFile(WeightsFirst):
        """checkpoint.load names one .pt file of fp32 weights: its weights, from step 0."""

        how = "state-dict"

        @classmethod
        def choose(cls, launch: StartContext) -> Start | None:
            path = launch.load_path
            if path is None or path.suffix != ".pt" or not path.is_file():
                return None
            return cls(folder=path.parent, tag=path.name)

        def weights(self) -> dict[str, torch.Tensor]:
            return safe_load.load(self.path)

    assert kinds[-1] is StateDictFile
    torch.manual_seed(1)
    trained = build_model(load_config(TINY)).state_dict()
    torch.save(trained, tmp_path / "weights.pt")
    cfg = load_config(TINY, [f"train.output_dir={tmp_path / 'run'}", f"checkpoint.load={tmp_path / 'weights.pt'}"])
    said: list[str] = []
    checkpointer = Checkpointer(cfg, 0, 1, said.append, lambda tag: None)
    torch.manual_seed(2)
    model = build_model(cfg)
    start = checkpointer.prepare(model)  # chosen, and its weights loaded before the engine exists
    assert isinstance(start, StateDictFile) and not start.loads_universal
    assert f"starting from {tmp_path / 'weights.pt'} (handoff/load, state-dict)" in said
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    progress = Progress()
    state = checkpointer.resume(None, progress, SimpleNamespace(fingerprint=None))
    assert state == {"loaded_from": str(tmp_path / "weights.pt")} and progress.step == 0
    assert not checkpointer.from_own_folder  # a run of its own
