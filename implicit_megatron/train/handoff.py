"""Which checkpoint a launch starts from, and how it gets into this launch's layout.

A launch starts from (1) its own `latest` checkpoint: a *resume* when that checkpoint belongs to
the phase being run, a *phase handoff* when it ended an earlier phase (`curriculum.run_phase`);
or (2) `checkpoint.load`, another run's checkpoint. A resume restores everything (the optimizer
state unless checkpoint.load_optimizer=false); a handoff or a load restores the weights and, as
checkpoint.load_optimizer / load_data_state say, the optimizer state and the data position. The
step count, and with it the LR schedule, always continues across a handoff.

The layout (data-parallel size, ZeRO stage, precision) may differ from the one that saved:
- same layout, or plain optimizers on both sides (ZeRO-0 in fp32/fp16, whose state is whole):
  DeepSpeed's own load;
- otherwise, with the optimizer state: the checkpoint is converted once to a DeepSpeed universal
  checkpoint (`<tag>/universal`, by deepspeed.checkpoint.ds_to_universal) and loaded from there;
- weights only: the consolidated fp32 weights go into the model before the engine is built,
  which works for every layout (DeepSpeed's module-only load does not at another ZeRO-3 size).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from implicit_megatron.config import Config
from implicit_megatron.train import safe_load
from implicit_megatron.train.errors import RunRefused
from implicit_megatron.train.integrity import (
    LATEST,
    MODEL_STATES,
    ZERO3_MODEL_STATES,
    DamagedCheckpoint,
    check_tag,
    fallback_hint,
    newest_complete,
    read_latest,
    record_universal,
    require_complete,
    step_of,
    tags_by_step,
    unvouched_universal,
)

UNIVERSAL = "universal"  # the sub-folder of a tag that holds its universal conversion
PRETRAINED_WEIGHTS = "model.safetensors"  # a folder written by tools/convert_checkpoint.py export/import


@dataclass(frozen=True)
class Layout:
    world_size: int
    zero_stage: int
    precision: str

    @property
    def plain_optimizer(self) -> bool:
        """ZeRO-0 without bf16 keeps torch's optimizer state whole, the same at every world size."""
        return self.zero_stage == 0 and self.precision != "bf16"


@dataclass
class Source:
    folder: Path  # a checkpoints/ folder, or an exported/imported model folder
    tag: str  # "" for a model folder
    resuming: bool  # this run's own checkpoint, same phase: restore everything
    saved: Layout | None  # None for a model folder
    load_optimizer: bool
    load_data_state: bool
    how: str = "native"  # native | universal | weights | pretrained (a model folder: weights, step 0)

    @property
    def path(self) -> Path:
        return self.folder / self.tag


def phase_of(tag: str) -> str | None:
    match = re.match(r"(.+)-step\d+$", tag)
    return match.group(1) if match else None


def model_states_file(path: Path) -> Path:
    """The file with a checkpoint tag's client state (our config, step, data position)."""
    for name in (MODEL_STATES, ZERO3_MODEL_STATES):
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(f"{path}: not a complete checkpoint (neither {MODEL_STATES} nor {ZERO3_MODEL_STATES})")


def read_client_state(path: Path) -> dict:
    """A tag's client state, memory-mapped: no tensor is read until used."""
    states = model_states_file(path)
    saved = safe_load.load(states, map_location="cpu", mmap=True)
    if "config" not in saved:
        raise ValueError(f"{states}: no run config in this checkpoint; was it written by implicit_megatron.train?")
    return saved


def saved_layout(path: Path) -> Layout:
    """The layout a checkpoint tag was written with."""
    saved = read_client_state(path)
    d = saved["config"]["distributed"]
    return Layout(int(saved.get("dp_world_size", 1)), int(d["zero_stage"]), d["precision"])


def resume_tag(cfg: Config, log) -> str | None:
    """The complete tag of this run's own checkpoints to start from (None: there are none).

    `latest` names it. When `latest` is missing or unreadable while tag folders exist, or names a
    tag that is incomplete or corrupt, the newest complete tag is taken instead, with a warning
    naming the damaged file, and `latest` is rewritten to name it (checkpoint.on_damaged=fail
    refuses instead). Never a fresh start over existing checkpoints. Run by rank 0 only: it reads
    every file of the tag it returns.
    """
    own = Path(cfg.output_dir) / "checkpoints"
    try:
        tag, problem = read_latest(own), None
    except DamagedCheckpoint as err:
        tag, problem = None, err
    if tag is not None:
        try:
            check_tag(own / tag)
            return tag
        except DamagedCheckpoint as err:
            problem = err
    if problem is None and not tags_by_step(own):
        return None  # a new run
    if problem is None:
        problem = DamagedCheckpoint(own / LATEST, "is missing although checkpoint folders exist")
    if cfg.checkpoint.on_damaged == "fail":
        raise DamagedCheckpoint(problem.file, f"{problem.problem}; {fallback_hint(own, tag or '')}; "
                                              "checkpoint.on_damaged=fallback would resume from it")
    chosen, damaged = newest_complete(own, before=step_of(tag) if tag else None)
    if chosen is None:
        found = "; ".join(str(d) for d in [problem, *damaged][:3])
        raise DamagedCheckpoint(problem.file, f"{problem.problem}, and no complete checkpoint is in {own} "
                                              f"({found}); remove them or choose another train.output_dir "
                                              "to start afresh")
    for err in [problem, *damaged]:
        log(f"warning: {err}")
    log(f"warning: resuming from {own / chosen}, the newest complete checkpoint; `latest` now names it")
    write_latest(own, chosen)
    return chosen


def write_latest(folder: Path, tag: str) -> None:
    """Point `latest` at `tag` atomically (write, fsync, rename)."""
    tmp = folder / f".{LATEST}.tmp"
    with open(tmp, "w") as handle:
        handle.write(tag + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, folder / LATEST)


def find_source(cfg: Config, world_size: int, tag: str | None) -> Source | None:
    """The checkpoint this launch starts from and how to load it; None for a fresh start.
    `tag` is this run's own tag to resume from (`resume_tag`, chosen by rank 0)."""
    own = Path(cfg.output_dir) / "checkpoints"
    c = cfg.checkpoint
    if tag is not None:
        run_phase = cfg.curriculum.run_phase
        resuming = run_phase is None or phase_of(tag) in (run_phase, None)
        # A resume restores the data position always, the optimizer state unless load_optimizer=false
        # (a fresh optimizer: the way to resume under a layout its state cannot convert to).
        source = Source(own, tag, resuming, saved_layout(own / tag), c.load_optimizer, resuming or c.load_data_state)
    elif c.load and (Path(c.load) / PRETRAINED_WEIGHTS).is_file():
        return Source(Path(c.load), "", False, None, False, False, how="pretrained")
    elif c.load:
        folder, tag = _named_checkpoint(Path(c.load))
        source = Source(folder, tag, False, saved_layout(folder / tag), c.load_optimizer, c.load_data_state)
    else:
        return None
    changed = shape_keys_changed(source, cfg)
    if changed and source.load_optimizer:  # DeepSpeed's loaders would fail deep inside, or not at all
        raise RunRefused(f"{source.path}: the checkpoint's model does not fit this config's ({changed}); restore "
                         "those settings (its weights and optimizer state load only into a model of the same shape)")
    now = Layout(world_size, cfg.distributed.zero_stage, cfg.distributed.precision)
    if not source.load_optimizer:
        source.how = "weights"
    elif source.saved == now or (source.saved.plain_optimizer and now.plain_optimizer):
        source.how = "native"
    elif source.saved.plain_optimizer or now.plain_optimizer:
        raise RunRefused(
            f"{source.path}: saved under ZeRO-{source.saved.zero_stage} {source.saved.precision} on "
            f"{source.saved.world_size} processes, loading under ZeRO-{now.zero_stage} {now.precision} on "
            f"{now.world_size}: a plain (ZeRO-0, not bf16) optimizer state converts only to another plain one. "
            "Keep both sides plain, or set checkpoint.load_optimizer=false to start the optimizer afresh")
    else:
        source.how = "universal"
    return source


def _named_checkpoint(path: Path) -> tuple[Path, str]:
    """checkpoint.load names a checkpoints/ folder (its `latest` is used) or one tag folder in it."""
    tag = read_latest(path)
    if tag is not None:
        return path, require_complete(path, tag)
    if read_latest(path.parent) is not None and any((path / n).is_file() for n in (MODEL_STATES, ZERO3_MODEL_STATES)):
        return path.parent, require_complete(path.parent, path.name)
    raise FileNotFoundError(f"checkpoint.load={path}: not a checkpoints folder (no '{LATEST}' file), a tag folder "
                            f"of one, or a model folder ({PRETRAINED_WEIGHTS})")


def to_universal(path: Path, workers: int = 2, log=None) -> Path:
    """Convert one checkpoint tag to a universal checkpoint in `<tag>/universal` (once; reused after).

    DeepSpeed loads a universal checkpoint with the full unpickler, so only a conversion of our own
    is ever loaded: one the tag's manifest records, file by file, after every file loaded with the
    weights-only unpickler. A `universal/` the manifest does not vouch for (copied in, changed, or
    holding a pickle that would run code) is removed and converted again, with a log line. The
    conversion runs in a process of its own (it starts worker pools) into a temporary folder that
    is renamed when complete, so an interrupted conversion is redone, never half-used.
    """
    out = path / UNIVERSAL
    if out.exists():
        problem = unvouched_universal(path, out)
        if problem is None:
            return out
        (log or print)(f"{out}: not used: {problem}; converting the checkpoint again")
        shutil.rmtree(out)
    tmp = path / f".{UNIVERSAL}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _convert(path, tmp, workers)
    for file in sorted(p for p in tmp.rglob("*") if p.is_file()):
        problem = safe_load.weights_only_problem(file)
        if problem:
            raise RuntimeError(f"{file}: the universal conversion wrote a file that does not load weights-only "
                               f"({problem}); it is not used")
    os.replace(tmp, out)
    record_universal(path, out)
    return out


def _convert(path: Path, out: Path, workers: int) -> None:
    """deepspeed.checkpoint.ds_to_universal from `path` into `out`, made loadable by every stage."""
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(path),
           "--output_folder", str(out), "--inject_missing_state", "--num_extract_workers", str(workers),
           "--num_merge_workers", str(max(1, workers // 2))]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a CPU-only job; it must not claim a GPU
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{path}: conversion to a universal checkpoint failed:\n{result.stdout[-3000:]}"
                           f"{result.stderr[-3000:]}")
    # The weights and optimizer state are in zero/; the model-states file only carries the client
    # state, and DeepSpeed looks for it under the name the *loading* ZeRO stage writes.
    for have, want in ((MODEL_STATES, ZERO3_MODEL_STATES), (ZERO3_MODEL_STATES, MODEL_STATES)):
        if (out / have).is_file() and not (out / want).exists():
            shutil.copy(out / have, out / want)
    _readable_by_every_stage(out)


def universal_of(ckpt_dir: str | Path, tag: str | None = None, workers: int = 4) -> Path:
    """`to_universal` for a checkpoints/ folder and a tag (default: latest), with clear errors."""
    folder = Path(ckpt_dir)
    tag = tag or read_latest(folder)
    if tag is None:
        raise FileNotFoundError(f"{folder}: not a checkpoint folder (no '{LATEST}' file); name a tag with --tag")
    layout = saved_layout(folder / tag)
    if layout.plain_optimizer:
        raise RunRefused(f"{folder / tag}: saved under ZeRO-0 in {layout.precision}; its optimizer state is whole "
                         "and loads at any world size as it is: there is nothing to convert")
    return to_universal(folder / tag, workers)


def _readable_by_every_stage(universal: Path) -> None:
    """Make a conversion load under every ZeRO stage.

    DeepSpeed writes a universal checkpoint in a ZeRO-1/2 or a ZeRO-3 form, and each stage's
    loader reads its own form only: the optimizer's global state (zero/optimizer_state.pt) under
    other keys, and per parameter a {"param": full-shaped tensor} dict plus step.pt (ZeRO-1/2)
    or a bare flat tensor (ZeRO-3). Write the ZeRO-1/2 form, which both loaders read, and add the
    ZeRO-3 keys of the global state.
    """
    import deepspeed

    zero = universal / "zero"
    path = zero / "optimizer_state.pt"
    sd = safe_load.load(path)
    if "optimizer_state_dict" in sd:  # written from ZeRO-3
        step = sd["optimizer_state_dict"]["state"][0]["step"]
        shapes = {}
        for group in safe_load.load(universal / ZERO3_MODEL_STATES, map_location="cpu")["param_shapes"]:
            shapes.update(group)
        for name, shape in shapes.items():
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                tensor = safe_load.load(zero / name / f"{key}.pt")
                if not isinstance(tensor, dict):
                    torch.save({"param": tensor.view(shape)}, zero / name / f"{key}.pt")
            if not (zero / name / "step.pt").exists():
                torch.save(step, zero / name / "step.pt")
    else:  # written from ZeRO-1/2: the ZeRO-3 loader reads the step from here
        step_file = next(zero.glob("*/step.pt"), None)
        step = safe_load.load(step_file) if step_file else 0
        sd["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": sd["param_groups"]}
    sd.setdefault("param_groups", sd["optimizer_state_dict"]["param_groups"])
    sd.setdefault("ds_version", deepspeed.__version__)
    torch.save(sd, path)


def consolidated_weights(path: Path, saved: Layout) -> dict[str, torch.Tensor]:
    """The full fp32 model state of a checkpoint tag, on CPU, whatever layout wrote it."""
    if saved.plain_optimizer:  # the module holds the fp32 weights themselves
        states = safe_load.load(path / MODEL_STATES, map_location="cpu", mmap=True)
        return {k: v.float() for k, v in states["module"].items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)


def source_weights(source: Source) -> dict[str, torch.Tensor]:
    """The fp32 weights a weights-only start loads into the model before the engine is built."""
    if source.how == "pretrained":
        from safetensors.torch import load_file

        return {k: v.float() for k, v in load_file(str(source.folder / PRETRAINED_WEIGHTS)).items()}
    return consolidated_weights(source.path, source.saved)


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> list[str]:
    """Load `state` into `model`, naming any tensor that does not fit; returns the names kept fresh.

    Plain weights fill weight-normalised layers (g and v are recomputed from w), and a model folder
    without an injection module leaves the model's freshly initialised one: the way an implicit run
    starts from an explicit model.
    """
    own = model.state_dict()
    direct, folded = {}, {}
    for name, tensor in state.items():
        target = name if name in own else name.removesuffix(".weight") + ".parametrizations.weight.original1"
        if target not in own:
            raise RunRefused(f"{where}: tensor {name!r} has no place in the model")
        if tensor.shape != own[target].shape:
            raise RunRefused(f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                             f"{tuple(own[target].shape)}")
        (direct if name in own else folded)[name] = tensor
    covered = set(direct) | {n.removesuffix(".weight") + f".parametrizations.weight.original{i}"
                             for n in folded for i in (0, 1)}
    fresh = [k for k in own if k not in covered]
    if any(not k.startswith("core.injection.") for k in fresh):
        missing = [k for k in fresh if not k.startswith("core.injection.")]
        raise RunRefused(f"{where}: no tensor for {missing[0]!r}" + (f" and {len(missing) - 1} more" if
                                                                      len(missing) > 1 else ""))
    model.load_state_dict(direct, strict=False)
    with torch.no_grad():
        for name, tensor in folded.items():  # g and v that give this weight
            module = model.get_submodule(name.removesuffix(".weight"))
            module.set_weight(tensor.to(module.parametrizations.weight.original1.dtype))
    return fresh


SHAPE_KEYS = tuple(f"model.{k}" for k in (
    "arch", "d_model", "n_layers", "vocab_size", "pad_vocab_multiple", "tie_embeddings", "mamba2.d_state",
    "mamba2.d_conv", "mamba2.expand", "mamba2.headdim", "mamba2.ngroups", "mamba2.bias", "mamba2.conv_bias",
    "llama.n_heads", "llama.n_kv_heads", "llama.ffn_dim", "llama.ffn_multiple_of", "llama.attention_bias")) + (
    "implicit.enabled", "implicit.injection", "implicit.weight_norm", "implicit.weight_norm_injection")
# the settings that fix the model's tensors (names and shapes); a checkpoint loads only where they agree
MISSING = object()


def shape_keys_changed(source: Source, cfg: Config) -> str:
    """The settings that fix the model's tensors whose values differ from the checkpoint's config, as
    'model.d_model: 64 in the checkpoint, 128 here' (empty when none differs or none is known)."""
    if source.saved is None:
        return ""
    try:
        saved = read_client_state(source.path)["config"]
    except (OSError, ValueError, KeyError):
        return ""

    def value(data: dict, dotted: str):
        for part in dotted.split("."):
            if not isinstance(data, dict) or part not in data:
                return MISSING  # a key older checkpoints lack
            data = data[part]
        return data

    now = cfg.to_dict()
    changed = {k: value(saved, k) for k in SHAPE_KEYS if value(saved, k) is not MISSING}
    changed = {k: v for k, v in changed.items() if v != value(now, k)}
    return "; ".join(f"{k}: {v!r} in the checkpoint, {value(now, k)!r} here" for k, v in changed.items())


def shape_error(source: Source, cfg: Config, err: Exception) -> RunRefused:
    """A load that failed on tensor shapes or names, explained by the config keys that differ."""
    changed = shape_keys_changed(source, cfg)
    detail = changed or str(err).strip().splitlines()[0]
    return RunRefused(f"{source.path}: the checkpoint's model does not fit this config's ({detail}); "
                      "restore those settings to resume, or start from its weights in a new run")


def load_source_weights(model: torch.nn.Module, source: Source, cfg: Config) -> list[str]:
    """load_weights from a weights-only source; a misfit is explained by the config keys that differ."""
    try:
        return load_weights(model, source_weights(source), source.path)
    except ValueError as err:
        if shape_keys_changed(source, cfg):
            raise shape_error(source, cfg, err) from None
        raise
