"""Saving and loading the training state through the DeepSpeed engine, with our client state.

Where the files go and what makes a tag complete is implicit_megatron.checkpoints (layout,
integrity); here: the engine's save into `.partial-{tag}` on every rank, the rename and `latest`
once all are done, pruning; and the load of a tag (the engine's state, the RNG, the data position,
refused when the data order changed).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.integrity import write_manifest
from implicit_megatron.checkpoints.layout import (
    PARTIAL,
    UNIVERSAL,
    UNIVERSAL_INFO,
    checkpoint_dir,
    prune,
    read_client_state,
    read_latest,
    write_latest,
)
from implicit_megatron.checkpoints.weights import model_settings_changed
from implicit_megatron.config import Config
from implicit_megatron.errors import RunRefused
from implicit_megatron.train.handoff import Source, shape_error

CRASH_BEFORE_LATEST = "IMPLICIT_MEGATRON_CRASH_BEFORE_LATEST"  # a tag: exit after writing it, before `latest`


class CheckpointSaveError(RuntimeError):
    """A save that failed (full disk, permissions): the run stops, `latest` is untouched."""


def _why_save_failed(err: Exception, partial: Path) -> str:
    """One line: the cause (errno's words, or a full disk that torch reports without one) and the file."""
    written = [p for p in partial.rglob("*") if p.is_file()] if partial.is_dir() else []
    last = max(written, key=lambda p: p.stat().st_mtime_ns, default=None)
    where = getattr(err, "filename", None) or last or partial
    free = shutil.disk_usage(partial.parent).free if partial.parent.is_dir() else None
    if isinstance(err, OSError) and err.errno is not None:
        cause = err.strerror
    elif free is not None and free < (1 << 20):
        cause = f"no space left on device ({free} bytes free)"
    else:
        cause = str(err).strip().splitlines()[0]
    return f"{cause} (writing {where})"


def data_signature(cfg: Config) -> dict:
    """What fixes the order of samples: a resume that changes it would repeat or skip data."""
    d = cfg.data
    return {"prefixes": list(d.prefixes), "weights": d.weights, "seq_len": d.seq_len, "seed": d.seed,
            "global_batch_size": cfg.train.global_batch_size, "steps": cfg.train.steps}  # see _check_data_signature


def save(engine, cfg: Config, tag: str, client_state: dict, val_loss: float | None = None) -> Path:
    """Save on every rank; move `latest` once all ranks are done; prune beyond keep_last (never the
    checkpoint with the best validation loss; `val_loss` is these weights', where known)."""
    folder = checkpoint_dir(cfg)
    client_state = {**client_state, "config": cfg.to_dict(), "data_signature": data_signature(cfg),
                    # lets DeepSpeed's ds_to_universal convert it (pure data parallelism: no TP/PP patterns)
                    UNIVERSAL_INFO: {"universal_checkpoint_version": 0.4}}
    rank, partial = dist.get_rank(), PARTIAL + tag
    if rank == 0:
        shutil.rmtree(folder / partial, ignore_errors=True)
    dist.barrier()
    failure = None
    try:
        engine.save_checkpoint(str(folder), tag=partial, client_state=client_state, save_latest=False)
        torch.save(_rng_state(), folder / partial / f"rng_rank{rank}.pt")
    except (OSError, RuntimeError) as err:  # torch reports a full disk as a RuntimeError without errno
        failure = _why_save_failed(err, folder / partial)
    failed = torch.tensor([failure is not None], dtype=torch.float64)
    dist.all_reduce(failed)  # every rank stops together; none waits at a barrier for a rank that failed
    if failed.item():
        if rank == 0:
            shutil.rmtree(folder / partial, ignore_errors=True)
        previous = read_latest(folder)
        kept = f"'latest' still names {folder / previous}, the previous complete checkpoint" if previous else \
            "no earlier checkpoint exists"
        raise CheckpointSaveError(f"checkpoint {tag} could not be saved into {folder}: "
                                  f"{failure or 'another rank failed to write its files'}; {kept}")
    if os.environ.get(CRASH_BEFORE_LATEST) == tag:  # fault injection for the tests: die as a kill would
        os._exit(137)
    if rank == 0:  # every rank has written: a manifest, the tag's real name, then `latest` names it
        write_manifest(folder / partial, val_loss)
        if (folder / tag).exists():  # an older copy of this step (e.g. damaged, left by a fallback)
            shutil.rmtree(folder / tag)
        os.replace(folder / partial, folder / tag)
        write_latest(folder, tag)
        prune(folder, cfg.checkpoint.keep_last, latest=tag)
    dist.barrier()
    return folder / tag


def load(engine, cfg: Config, source: Source, fingerprint=None) -> dict:
    """Load `source` (see handoff.find_source) into the engine; returns the client state.

    A resume restores everything; a handoff or a start from checkpoint.load restores what
    checkpoint.load_* ask for. Weights-only starts were loaded into the model before the engine
    was built (handoff.consolidated_weights), so only the client state is read here.
    """
    if source.how == "pretrained":
        return {"loaded_from": str(source.folder)}
    if source.how == "weights":
        client_state = read_client_state(source.path)
    else:
        folder, tag = (source.path, UNIVERSAL) if source.how == "universal" else (source.folder, source.tag)
        # The optimizer's hyperparameters come from this run's config (DeepSpeed's ZeRO-3 universal
        # load would give every parameter group the first group's weight decay); the LR is set per step.
        groups = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]
        try:
            _, client_state = engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                                     load_lr_scheduler_states=False)
        except RuntimeError as err:  # load_state_dict's size mismatch or missing keys
            if model_settings_changed(source.path, cfg) or "state_dict" in str(err):
                raise shape_error(source, cfg, err) from None
            raise
        if client_state is None:
            raise RuntimeError(f"{source.path}: DeepSpeed could not load this checkpoint")
        for group, settings in zip(engine.optimizer.param_groups, groups):
            group.update(settings)
    if source.load_data_state:
        client_state["extended"] = _check_data_signature(cfg, client_state, source.path, fingerprint)
    rng = source.path / f"rng_rank{dist.get_rank()}.pt"
    if source.resuming and source.saved.world_size == dist.get_world_size() and rng.is_file():
        _set_rng_state(safe_load.load(rng))
    client_state["loaded_from"] = str(source.path)
    return client_state


def _check_data_signature(cfg: Config, client_state: dict, where: Path, fingerprint=None) -> bool:
    """Refuse a resume that changes the data order. Raising train.steps alone (extending the run) is
    accepted when the samples already seen come in the same order in the data of the new length:
    `fingerprint(n)` (the task's digest of the order of its first n samples) must equal the one
    saved with the checkpoint. Returns whether the run was extended."""
    saved = client_state.get("data_signature", {})
    now = data_signature(cfg)
    changed = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
    consumed = int(client_state.get("consumed_samples", 0))
    if "steps" in changed and consumed > cfg.train.steps * cfg.train.global_batch_size:
        before, after = changed["steps"]
        changed["steps"] = (before, f"{after} (fewer samples than the checkpoint has already seen)")
    elif set(changed) == {"steps"} and fingerprint is not None and "data_fingerprint" in client_state:
        if fingerprint(consumed) == client_state["data_fingerprint"]:
            return True
        before, after = changed["steps"]
        changed["steps"] = (before, f"{after} (the samples already seen come in another order at this length)")
    if changed and not cfg.checkpoint.allow_data_change:
        detail = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise RunRefused(f"{where}: resuming with a changed data order ({detail}) would repeat or skip samples; "
                         "restore those settings or set checkpoint.allow_data_change=true")
    return False


def _rng_state() -> dict:
    """Every generator's state in types a weights-only load builds (numpy's array as a tensor)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
