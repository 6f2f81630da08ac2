"""Choosing how a launch loads its checkpoint, phase settings, weights into a model, the plan of
launch/curriculum.sh: everything about the handoff that needs no second process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.fake_checkpoints import fake_checkpoint

from implicit_megatron import build_model, load_config
from implicit_megatron.builder import remove_weight_norm
from implicit_megatron.checkpoints.layout import DamagedCheckpoint
from implicit_megatron.checkpoints.weights import load_weights
from implicit_megatron.config.plan import recorded_bounds, run_bounds
from implicit_megatron.errors import RunRefused
from implicit_megatron.launch.curriculum import plan
from implicit_megatron.train.handoff import resume_tag
from implicit_megatron.train.starts import find_source
from implicit_megatron.utils.typed_yaml import ConfigError

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "configs/tiny/mamba2-implicit.yaml")
CURRICULUM = str(ROOT / "configs/tiny/mamba2-curriculum.yaml")


def source_for(out: Path, world: int, *overrides: str):
    cfg = load_config(TINY, [f"train.output_dir={out}", *overrides])
    return find_source(cfg, world, resume_tag(cfg, print))


@pytest.mark.parametrize(("saved", "now", "how"), [
    ((2, 2, "fp32"), (2, 2, "fp32"), "native"),       # same layout
    ((2, 0, "fp32"), (1, 0, "fp32"), "native"),       # plain optimizer state is whole
    ((2, 2, "fp32"), (1, 2, "fp32"), "universal"),    # another world size
    ((2, 2, "fp32"), (2, 3, "fp32"), "universal"),    # another stage
    ((4, 3, "bf16"), (2, 1, "bf16"), "universal"),
    ((2, 0, "bf16"), (1, 0, "bf16"), "universal"),    # bf16 ZeRO-0 keeps its fp32 state apart too
])
def test_layout_decides_how_a_checkpoint_loads(saved, now, how, tmp_path):
    fake_checkpoint(tmp_path, "bounded-step8", *saved)
    source = source_for(tmp_path, now[0], f"distributed.zero_stage={now[1]}", f"distributed.precision={now[2]}",
                        "curriculum.run_phase=bounded")
    assert source.how == how and source.resuming and source.load_optimizer


def test_plain_to_partitioned_optimizer_needs_a_weights_only_start(tmp_path):
    fake_checkpoint(tmp_path, "bounded-step8", 2, 0)
    with pytest.raises(ValueError, match="load_optimizer=false"):
        source_for(tmp_path, 2, "distributed.zero_stage=2", "curriculum.run_phase=bounded")
    source = source_for(tmp_path, 2, "distributed.zero_stage=2", "curriculum.run_phase=free",
                        "checkpoint.load_optimizer=false")
    assert source.how == "weights" and not source.resuming
    # the advice holds for a resume too: weights, step and data position; the optimizer starts afresh
    resume = source_for(tmp_path, 2, "distributed.zero_stage=2", "curriculum.run_phase=bounded",
                        "checkpoint.load_optimizer=false")
    assert resume.how == "weights" and resume.resuming and resume.load_data_state and not resume.load_optimizer


def test_a_resume_with_another_model_shape_names_the_keys(tmp_path):
    fake_checkpoint(tmp_path, "bounded-step8", 1, 0)
    with pytest.raises(ValueError, match=r"bounded-step8: the checkpoint's model does not fit this config's "
                                         r"\(model.d_model: 64 in the checkpoint, 96 here; model.n_layers: 2 in "
                                         r"the checkpoint, 3 here\)"):
        source_for(tmp_path, 1, "model.d_model=96", "model.n_layers=3", "curriculum.run_phase=bounded")
    source_for(tmp_path, 1, "model.init=released", "curriculum.run_phase=bounded")  # not a shape setting


def test_handoff_versus_resume(tmp_path):
    fake_checkpoint(tmp_path, "bounded-step8", 2, 2)
    handoff = source_for(tmp_path, 2, "distributed.zero_stage=2", "curriculum.run_phase=free",
                         "checkpoint.load_data_state=false")
    assert not handoff.resuming and handoff.load_optimizer and not handoff.load_data_state
    resume = source_for(tmp_path, 2, "distributed.zero_stage=2", "checkpoint.load_data_state=false")
    assert resume.resuming and resume.load_data_state  # a resume restores the data position, whatever it says
    assert source_for(tmp_path.parent / f"{tmp_path.name}-elsewhere", 2) is None  # beside it: a folder of its own


def test_resume_never_starts_over_existing_checkpoints(tmp_path):
    cfg = load_config(TINY, [f"train.output_dir={tmp_path}"])
    fake_checkpoint(tmp_path, "bounded-step4", 1, 0)
    fake_checkpoint(tmp_path, "bounded-step8", 1, 0)
    (tmp_path / "checkpoints" / "bounded-step10").mkdir()  # a kill mid-save
    latest = tmp_path / "checkpoints" / "latest"
    latest.unlink()
    said = []
    assert resume_tag(cfg, said.append) == "bounded-step8"
    assert "latest: is missing although checkpoint folders exist" in said[0]
    assert latest.read_text().strip() == "bounded-step8"  # what the curriculum launcher and the next resume read
    latest.unlink()
    strict = load_config(TINY, [f"train.output_dir={tmp_path}", "checkpoint.on_damaged=fail"])
    with pytest.raises(DamagedCheckpoint, match="previous complete checkpoint is .*bounded-step8"):
        resume_tag(strict, said.append)
    for tag in ("bounded-step4", "bounded-step8"):
        (tmp_path / "checkpoints" / tag / "rng_rank0.pt").unlink()
    with pytest.raises(DamagedCheckpoint, match="no complete checkpoint is in .*choose another train.output_dir"):
        resume_tag(cfg, said.append)


def test_checkpoint_load_names_what_it_accepts(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoints folder"):
        source_for(tmp_path / "run", 1, f"checkpoint.load={tmp_path}")
    fake_checkpoint(tmp_path / "other", "free-step10", 1, 0)
    tag_folder = source_for(tmp_path / "run", 1, f"checkpoint.load={tmp_path / 'other/checkpoints/free-step10'}")
    assert tag_folder.tag == "free-step10" and tag_folder.how == "native"


def test_phase_settings_apply_to_their_own_launch_only():
    cfg = load_config(CURRICULUM, ["curriculum.run_phase=free"])
    assert cfg.distributed.zero_stage == 3
    assert load_config(CURRICULUM, ["curriculum.run_phase=bounded"]).distributed.zero_stage == 2
    with pytest.raises(ConfigError, match=r"phases\[0\].zero_stage: a phase with its own settings needs a launch"):
        load_config(CURRICULUM)
    with pytest.raises(ConfigError, match="not divisible by micro_batch_size x data-parallel size = 8 x 2"):
        load_config(CURRICULUM, ["curriculum.run_phase=free", "train.micro_batch_size=8"], world_size=2)


def test_raised_steps_lengthen_the_last_phase_and_never_move_trained_steps():
    cfg = load_config(TINY, ["train.steps=30"])
    trained = [["bounded", 0, 16], ["free", 16, 20]]  # a finished run of 20 steps
    bounds, note = run_bounds(cfg, trained, 20)
    assert [(p.name, a, b) for p, a, b in bounds] == [("bounded", 0, 16), ("free", 16, 30)]
    assert note == ("train.steps raised from 20 to 30: steps 20-29 continue the last phase, 'free'; the phases "
                    "before keep their steps")
    bounds, note = run_bounds(cfg, [["bounded", 0, 32], ["free", 32, 40]], 10)  # still bounded: no trained step
    assert note is None and [(a, b) for _, a, b in bounds] == [(0, 24), (24, 30)]  # moves, the new fractions rule
    with pytest.raises(ValueError, match=r"step 8 was trained in phase 'bounded', but train.steps 10 and the "
                                         r"phases' fractions now put it in phase 'free'"):
        run_bounds(load_config(TINY, ["train.steps=10"]), trained, 10)  # lowered before the last phase
    assert recorded_bounds({"config": load_config(TINY, ["train.steps=20"]).to_dict()}) == trained


def test_curriculum_plan_marks_finished_phases(tmp_path):
    def done(overrides):
        return [phase.done for phase in plan(CURRICULUM, overrides)]

    overrides = [f"train.output_dir={tmp_path}", "train.steps=10"]
    planned = plan(CURRICULUM, overrides)
    assert [(p.name, p.done, p.environment(), str(p.config.output_dir), p.span.start, p.span.end) for p in planned] \
        == [("bounded", False, {"GPUS_PER_NODE": "2", "NPROC": "2"}, str(tmp_path), 0, 8),
            ("free", False, {"GPUS_PER_NODE": "1", "NPROC": "1"}, str(tmp_path), 8, 10)]
    fake_checkpoint(tmp_path, "bounded-step8", 2, 2, "fp32", "train.steps=10")
    assert done(overrides) == [True, False]
    (tmp_path / "checkpoints" / "latest").write_text("free-step10\n")  # names a tag that is not there
    assert done(overrides) == [True, False]
    fake_checkpoint(tmp_path, "free-step10", 1, 3, "fp32", "train.steps=10")
    assert done(overrides) == [True, True]
    # train.steps raised on the finished run: the free phase is lengthened, the bounded one stays done
    assert done([f"train.output_dir={tmp_path}", "train.steps=20"]) == [True, False]


def test_plain_weights_fill_a_weight_normalised_model_and_a_missing_injection_stays_fresh():
    torch.manual_seed(0)
    source = build_model(load_config(TINY, ["implicit.weight_norm=true"]))
    remove_weight_norm(source)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith("core.injection.")}
    target = build_model(load_config(TINY, ["implicit.weight_norm=true"]))
    injection = {k: v.clone() for k, v in target.state_dict().items() if k.startswith("core.injection.")}
    fresh = load_weights(target, state, Path("folder"))
    assert sorted(fresh) == sorted(injection)
    for name, tensor in injection.items():
        assert torch.equal(target.state_dict()[name], tensor)
    remove_weight_norm(target)
    for name, tensor in state.items():
        torch.testing.assert_close(target.state_dict()[name], tensor, rtol=1e-6, atol=1e-7)


def test_weights_that_do_not_fit_are_named():
    model = build_model(load_config(TINY))
    state = model.state_dict()
    with pytest.raises(ValueError, match=r"folder: tensor 'embedding.weight' has shape \(3, 64\)"):
        load_weights(model, {**state, "embedding.weight": torch.zeros(3, 64)}, Path("folder"))
    with pytest.raises(ValueError, match="tensor 'extra.weight' has no place"):
        load_weights(model, {**state, "extra.weight": torch.zeros(1)}, Path("folder"))
    missing = {k: v for k, v in state.items() if k != "core.backbone.norm_f.weight"}
    with pytest.raises(ValueError, match="no tensor for 'core.backbone.norm_f.weight'"):
        load_weights(model, missing, Path("folder"))


@pytest.mark.processes
def test_universal_command_errors(tmp_path):
    def universal(*args):
        return subprocess.run([sys.executable, "tools/convert_checkpoint.py", "universal", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True)

    assert "not a checkpoint folder" in universal(tmp_path).stderr
    fake_checkpoint(tmp_path, "free-step10", 2, 0)
    result = universal(tmp_path / "checkpoints")
    assert result.returncode == 2 and "nothing to convert" in result.stderr
    missing = universal(tmp_path / "checkpoints", "--tag", "free-step9")
    assert missing.returncode == 2 and "checkpoints: no checkpoint with tag 'free-step9'" in missing.stderr


def test_raised_steps_are_accepted_only_when_the_seen_order_holds():
    from implicit_megatron.train.checkpointer import _check_data_signature, data_signature

    cfg = load_config(TINY, ["train.steps=20"])
    saved = {"data_signature": {**data_signature(cfg), "steps": 10}, "consumed_samples": 80,
             "data_fingerprint": "abc"}
    assert _check_data_signature(cfg, saved, Path("ckpt"), lambda n: "abc" if n == 80 else "?")
    with pytest.raises(ValueError, match=r"steps: 10 -> .20 \(the samples already seen come in another order"):
        _check_data_signature(cfg, saved, Path("ckpt"), lambda n: "xyz")
    other = {**saved, "data_signature": {**saved["data_signature"], "seed": 1}}
    with pytest.raises(ValueError, match="changed data order"):  # more than the length changed
        _check_data_signature(cfg, other, Path("ckpt"), lambda n: "abc")
    same = {**saved, "data_signature": data_signature(cfg)}  # nothing changed in the config ...
    assert not _check_data_signature(cfg, same, Path("ckpt"), lambda n: "abc")
    with pytest.raises(ValueError, match=r"data: 'the samples this checkpoint has seen' -> 'others \(the shards "):
        _check_data_signature(cfg, same, Path("ckpt"), lambda n: "xyz")  # ... but the shards were rebuilt


def test_an_interrupted_save_is_said_removed_only_when_it_was(tmp_path, monkeypatch):
    from implicit_megatron.checkpoints import layout

    cfg = load_config(TINY, [f"train.output_dir={tmp_path}"])
    leftover = tmp_path / "checkpoints" / ".partial-free-step12"
    leftover.mkdir(parents=True)
    said = []

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(layout.shutil, "rmtree", refuse)
    layout.remove_partial(cfg, said.append)
    assert said == [f"warning: could not remove {leftover}, a checkpoint whose save was interrupted ([Errno 13] "
                    f"Permission denied: '{leftover}'); it is never loaded"]
    monkeypatch.undo()
    said.clear()
    layout.remove_partial(cfg, said.append)
    assert said == [f"removed {leftover}, a checkpoint whose save was interrupted"] and not leftover.exists()


def test_a_tag_another_run_saved_or_that_was_renamed_is_refused_by_name(tmp_path):
    """`latest` naming a tag copied in from another run (or renamed) would skip or repeat this run's
    steps: refused naming the tag and why, unless accepted explicitly."""
    from implicit_megatron.checkpoints.layout import RUN_ID, own_run_id
    from implicit_megatron.train.handoff import refuse_foreign_tag

    checkpoints = tmp_path / "checkpoints"
    ours = own_run_id(checkpoints)
    assert (checkpoints / RUN_ID).read_text().strip() == ours and own_run_id(checkpoints) == ours
    cfg = load_config(TINY, [f"train.output_dir={tmp_path}"])
    fake_checkpoint(tmp_path, "step8", 1, 0, client={"step": 8, "run_id": ours})
    fake_checkpoint(tmp_path, "step9", 1, 0, client={"step": 9, "run_id": "0123abcd"})
    fake_checkpoint(tmp_path, "step10", 1, 0, client={"step": 12, "run_id": ours})
    fake_checkpoint(tmp_path, "step11", 1, 0)  # saved before run ids: nothing to tell
    for tag in ("step8", "step11"):
        refuse_foreign_tag(cfg, tag, ours)
    with pytest.raises(RunRefused, match=rf"{checkpoints / 'step9'}: was saved by another run \(run id 0123abcd; "
                                         rf"this run's is {ours}"):
        refuse_foreign_tag(cfg, "step9", ours)
    with pytest.raises(RunRefused, match=rf"{checkpoints / 'step10'}: holds step 12, not the step its name says.*"
                                         "checkpoint.accept_foreign_checkpoint=true"):
        refuse_foreign_tag(cfg, "step10", ours)
    accepting = load_config(TINY, [f"train.output_dir={tmp_path}", "checkpoint.accept_foreign_checkpoint=true"])
    for tag in ("step9", "step10"):
        refuse_foreign_tag(accepting, tag, ours)
    fresh = tmp_path / "legacy" / "checkpoints"
    assert own_run_id(fresh, adopt="feedbeef") == "feedbeef"  # a folder from before run ids takes its tags' id
