"""Build a corpus's shards on first use, so that a new checkout can train without a manual step.

`ensure_shards` is what the quickstart launcher calls before training on the bundled corpus: the
first call tokenizes `source` into `{prefix}_{train,valid,test}`, later calls return at once.
Concurrent callers (several ranks) take turns on the preprocessing lock; the first builds, the
rest find the shards done.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.shard_check import file_sha256, read_stats
from data_pipeline.shard_tokenizer import matches_record, tokenizer_record
from data_pipeline.tokenizer import load_tokenizer


def builds_from_source(prefix: str) -> bool:
    """Shards are built from a config's data.source only into a prefix under a data/cache/ folder (as
    the quickstart's): anywhere else a missing prefix is more likely a typo than a wish."""
    parts = Path(prefix).resolve().parts
    return any(parts[i:i + 2] == ("data", "cache") for i in range(len(parts) - 1))


def ensure_shards(source: str, prefix: str, tokenizer: str, valid_fraction: float, test_fraction: float,
                  *, workers: int | None = None, append_eod: bool = True, progress: bool = True) -> None:
    """Tokenize `source` into shards at `prefix` unless a finished build of the same source is there.

    An existing build made with another tokenizer raises ValueError (training on it would be
    wrong). A build made here records the source it was made from (`{prefix}_source.json`: its
    path, size and sha256). Shards are never deleted or rebuilt: a build of another source, or of
    this one before it changed, raises SourceMismatch naming both; shards with no record (made by
    `data_pipeline.preprocess`, say) are the user's, kept as they are and never claimed.
    """
    stats_path, record = f"{prefix}_stats.json", f"{prefix}{SOURCE_RECORD}"
    if os.path.isfile(stats_path):
        _check_tokenizer(stats_path, tokenizer)
        problem = source_mismatch(source, prefix)
        if problem is not None:
            raise SourceMismatch(problem)
        if _read_record(record) is None:
            print(f"[data] {prefix}_* were not built from data.source (no {Path(record).name}): training on "
                  f"them as they are; {source} is not read", flush=True)
        return
    now = source_identity(source)
    if workers is None:
        workers = max(1, min(4, (os.cpu_count() or 2) - 1))
    print(f"[data] building {prefix}_{{train,valid,test}} from {source} (data.source, first use)", flush=True)
    config = PreprocessConfig(inputs=[source], tokenizer=tokenizer, output_prefix=prefix,
                              workers=workers, append_eod=append_eod, valid_fraction=valid_fraction,
                              test_fraction=test_fraction, progress=progress)
    run_preprocess(config)  # under its lock: a concurrent caller that finished first makes this a no-op
    _write_record(record, now)


SOURCE_RECORD = "_source.json"  # beside {prefix}_stats.json: the source file a build was made from


class SourceMismatch(ValueError):
    """Shards at the prefix were built from another source (or an earlier state of this one)."""


def source_mismatch(source: str, prefix: str) -> str | None:
    """Why the shards at `prefix` are not data.source's, or None: they were built from it as it is
    now, or they carry no record of a source (the user's own, made by preprocess)."""
    built = _read_record(f"{prefix}{SOURCE_RECORD}")
    if built is None:
        return None
    now = source_identity(source)
    if built.get("sha256") == now["sha256"]:
        return None
    was = (f"{built.get('path')} ({built.get('size')} bytes)" if built.get("path") != now["path"]
           else f"{source} as it was then ({built.get('size')} bytes; it is {now['size']} bytes now, another sha256)")
    return (f"{prefix}_* were built from {was}, but data.source is {source}. Nothing was changed: set data.source "
            f"to the file they were built from, set data.prefixes to another folder under data/cache/ to build "
            f"{source} there, or remove {prefix}_* yourself to rebuild them from {source}")


def source_identity(source: str) -> dict:
    return {"path": os.path.abspath(source), "size": os.path.getsize(source), "sha256": file_sha256(source)}


def _read_record(path: str) -> dict | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _write_record(path: str, identity: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(identity, handle)
    os.replace(tmp, path)


def _check_tokenizer(stats_path: str, tokenizer: str) -> None:
    """The shards' recorded tokenizer is `tokenizer`: the same identity (what it does), or for
    stats written before the identity, the same file (sha256)."""
    record = tokenizer_record(read_stats(stats_path[: -len("_stats.json")])) or {}
    ours = load_tokenizer(tokenizer)
    path = ours.path  # the file, when `tokenizer` names a folder
    if not matches_record(record, ours):
        raise ValueError(f"{stats_path}: these shards were tokenized with another tokenizer than {path}; "
                         f"remove {stats_path[: -len('_stats.json')]}_* to rebuild them")
