"""A checkpoint tag converted to DeepSpeed's universal format, which loads at any world size and
ZeRO stage (deepspeed.checkpoint.ds_to_universal), written once into `<tag>/universal`.

DeepSpeed loads a universal checkpoint with the full unpickler, so only a conversion of our own is
ever used: every file it writes is first loaded with the weights-only unpickler and then recorded,
file by file, in the tag's manifest; a `universal/` the manifest does not vouch for is converted
again. The conversion itself reads only the files a tag must hold (linked into a folder of their
own, so that a file planted beside them is never read), and reads them weights-only
(checkpoints/weights_only_convert.py).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.integrity import (
    expected_files,
    record_universal,
    require_complete,
    unvouched_universal,
)
from implicit_megatron.checkpoints.layout import UNIVERSAL, UNIVERSAL_TMP, find_checkpoint, saved_layout
from implicit_megatron.deepspeed_internals import (
    MODEL_STATES,
    UNIVERSAL_NOTE,
    UNIVERSAL_OPTIMIZER_STATE,
    UNIVERSAL_ZERO,
    ZERO3_MODEL_STATES,
    universal_param_file,
)
from implicit_megatron.errors import RunRefused
from implicit_megatron.utils.lean_imports import import_deepspeed
from implicit_megatron.utils.own_files import STAGING_SUFFIX
from implicit_megatron.utils.safe_write import OUT_OF_ROOM, out_of_room, remove_leftover, room_cause, room_cause_of


def to_universal(path: Path, workers: int = 2, log=None) -> Path:
    """Convert one checkpoint tag to a universal checkpoint in `<tag>/universal` (once; reused after).

    DeepSpeed loads a universal checkpoint with the full unpickler, so only a conversion of our own
    is ever loaded: one the tag's manifest records, file by file, after every file loaded with the
    weights-only unpickler. A `universal/` the manifest does not vouch for (copied in, changed, or
    holding a pickle that would run code) is removed and converted again, with a log line. The
    conversion runs in a process of its own (it starts worker pools) into a temporary folder that
    is renamed when complete, so an interrupted conversion is redone, never half-used; a failed one
    is removed, and one that failed for want of room (a full disk, a file size limit) says so in one
    line instead of the converter's tracebacks.
    """
    out = path / UNIVERSAL
    if out.exists():
        problem = unvouched_universal(path, out)
        if problem is None:
            return out
        (log or print)(f"{out}: not used: {problem}; converting the checkpoint again")
        out.unlink() if out.is_symlink() else shutil.rmtree(out)
    tmp = path / UNIVERSAL_TMP
    remove_leftover(tmp)  # a link there would have the converter write through it
    try:
        _convert(path, tmp, workers)
        _refuse_unsafe_files(tmp)
        os.replace(tmp, out)
        (path / UNIVERSAL_NOTE).unlink(missing_ok=True)  # names the temporary folder: wrong once renamed
        record_universal(path, out)
    except BaseException as err:
        why = _without_room(err, path) if isinstance(err, Exception) else None  # measured before the removal
        for partial in (tmp, out):  # `out` only where the failure came after the rename (the manifest's write)
            remove_leftover(partial)
        if why is None:
            raise
        raise RuntimeError(f"{path}: conversion to a universal checkpoint failed: {why}; the partial conversion was "
                           "removed and the checkpoint itself is intact") from None
    return out


class ConversionFailed(RuntimeError):
    """The converter's process failed; `output` is the end of what it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


# what a write cut short for want of room leaves in an error: the OS's words, or torch's own
CUT_SHORT = (*(os.strerror(code) for code in OUT_OF_ROOM), "unexpected pos", "iostream error", "file write failed")


def _without_room(err: Exception, tag: Path) -> str | None:
    """One line for a conversion that failed for want of room (a full disk, a quota, a file size
    limit): the cause in words and the file it was writing; None for any other failure. The
    converter's process says so only in its tracebacks, and torch names no file: the file is the one
    at the file size limit, else the newest of the partial conversion."""
    said = err.output if isinstance(err, ConversionFailed) else str(err)
    if not out_of_room(err) and not any(mark in said for mark in CUT_SHORT):
        return None
    written = getattr(err, "filename", None) or _last_written(tag / UNIVERSAL_TMP, tag / UNIVERSAL)
    cause = room_cause(said, tag, written) if isinstance(err, ConversionFailed) else room_cause_of(err, tag, written)
    if cause is None:
        return None
    return f"{cause} (writing {written})" if written else cause


def _last_written(*folders: Path) -> Path | None:
    """The file of `folders` a write cut short was writing: the one at the file size limit (no other
    file reaches it), else the newest."""
    files = [p for folder in folders if folder.is_dir() and not folder.is_symlink()
             for p in folder.rglob("*") if p.is_file()]
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    at_limit = [p for p in files if limit != resource.RLIM_INFINITY and p.stat().st_size >= limit]
    return max(at_limit or files, key=lambda p: p.stat().st_mtime_ns, default=None)


def _refuse_unsafe_files(converted: Path) -> None:
    """Every file of the conversion loads weights-only (DeepSpeed loads them with the full unpickler)."""
    for file in sorted(p for p in converted.rglob("*") if p.is_file()):
        problem = safe_load.weights_only_problem(file)
        if problem:
            raise RuntimeError(f"{file}: the universal conversion wrote a file that does not load weights-only "
                               f"({problem}); it is not used")


def _convert(path: Path, out: Path, workers: int) -> None:
    """deepspeed.checkpoint.ds_to_universal from `path` into `out`, made loadable by every stage.
    It reads the tag's own files only, weights-only (see the module docstring)."""
    staged = path.parent / f".{path.name}{STAGING_SUFFIX}"
    remove_leftover(staged)
    try:
        _stage_own_files(path, staged)
        cmd = [sys.executable, "-m", "implicit_megatron.checkpoints.weights_only_convert", "--input_folder",
               str(staged), "--output_folder", str(out), "--inject_missing_state", "--num_extract_workers",
               str(workers), "--num_merge_workers", str(max(1, workers // 2))]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a CPU-only job; it must not claim a GPU
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    finally:
        remove_leftover(staged)
    if result.returncode != 0:
        output = f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        raise ConversionFailed(f"{path}: conversion to a universal checkpoint failed:\n{output}", output)
    # The weights and optimizer state are in zero/; the model-states file only carries the client
    # state, and DeepSpeed looks for it under the name the *loading* ZeRO stage writes.
    for have, want in ((MODEL_STATES, ZERO3_MODEL_STATES), (ZERO3_MODEL_STATES, MODEL_STATES)):
        if (out / have).is_file() and not (out / want).exists():
            shutil.copy(out / have, out / want)
    _readable_by_every_stage(out)


def _stage_own_files(path: Path, staged: Path) -> None:
    """The files the tag must hold (integrity.expected_files), hard-linked (else copied) into
    `staged`: the converter globs its input folder, and must find nothing else there."""
    staged.mkdir()
    for file in expected_files(path):
        try:
            os.link(file, staged / file.name)
        except OSError:  # a file system without hard links
            shutil.copy2(file, staged / file.name)


def universal_of(ckpt_dir: str | Path, tag: str | None = None, workers: int = 4) -> Path:
    """`to_universal` for a run folder, a checkpoints/ folder or a tag folder (default: latest), with
    clear errors."""
    folder, tag = find_checkpoint(ckpt_dir, tag)
    require_complete(folder, tag)  # every file reads back, nothing in it would run code or is not its own
    layout = saved_layout(folder / tag)
    if layout.plain_optimizer:
        raise RunRefused(f"{folder / tag}: saved under ZeRO-0 in {layout.precision}; its optimizer state is whole "
                         "and loads at any world size as it is: there is nothing to convert")
    return to_universal(folder / tag, workers)


def _readable_by_every_stage(universal: Path) -> None:
    """Make a conversion load under every ZeRO stage.

    DeepSpeed writes a universal checkpoint in a ZeRO-1/2 or a ZeRO-3 form, and each stage's
    loader reads its own form only: the optimizer's global state under other keys, and per
    parameter a {"param": full-shaped tensor} dict plus a file of its step (ZeRO-1/2) or a bare
    flat tensor (ZeRO-3). Write the ZeRO-1/2 form, which both loaders read, and add the
    ZeRO-3 keys of the global state.
    """
    import_deepspeed()
    import deepspeed

    path = universal / UNIVERSAL_ZERO / UNIVERSAL_OPTIMIZER_STATE
    sd = safe_load.load(path)
    if "optimizer_state_dict" in sd:  # written from ZeRO-3
        step = sd["optimizer_state_dict"]["state"][0]["step"]
        shapes = {}
        for group in safe_load.load(universal / ZERO3_MODEL_STATES, map_location="cpu")["param_shapes"]:
            shapes.update(group)
        for name, shape in shapes.items():
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                tensor = safe_load.load(universal / universal_param_file(name, key))
                if not isinstance(tensor, dict):
                    torch.save({"param": tensor.view(shape)}, universal / universal_param_file(name, key))
            if not (universal / universal_param_file(name, "step")).exists():
                torch.save(step, universal / universal_param_file(name, "step"))
    else:  # written from ZeRO-1/2: the ZeRO-3 loader reads the step from here
        step_file = next(universal.glob(universal_param_file("*", "step")), None)
        step = safe_load.load(step_file) if step_file else 0
        sd["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": sd["param_groups"]}
    sd.setdefault("param_groups", sd["optimizer_state_dict"]["param_groups"])
    sd.setdefault("ds_version", deepspeed.__version__)
    torch.save(sd, path)


