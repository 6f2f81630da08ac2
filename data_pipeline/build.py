"""Build a corpus's shards on first use, so that a new checkout can train without a manual step.

`ensure_shards` is what the quickstart launcher calls before training on the bundled corpus: the
first call tokenizes `source` into `{prefix}_{train,valid,test}`, later calls return at once.
Concurrent callers (several ranks) take turns on the preprocessing lock; the first builds, the
rest find the shards done.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.plan import file_sha256
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
    wrong). A build records the source it was made from (`{prefix}_source.json`: its size and
    sha256); when the source has changed since, the shards are built again (a run that resumes on
    them is then refused by its checkpoint's data fingerprint). Otherwise an existing build is kept
    as is, whatever fractions it was made with.
    """
    stats_path, record = f"{prefix}_stats.json", f"{prefix}{SOURCE_RECORD}"
    now = source_identity(source)
    if os.path.isfile(stats_path):
        _check_tokenizer(stats_path, tokenizer)
        built = _read_record(record)
        if built is None:  # built before sources were recorded: nothing to compare with
            _write_record(record, now)
            return
        if built.get("sha256") == now["sha256"]:
            return
        print(f"[data] {source} changed since {prefix}_* were built from it (size {built.get('size')} -> "
              f"{now['size']} bytes, another sha256): building them again", flush=True)
        _remove_build(prefix)
    if workers is None:
        workers = max(1, min(4, (os.cpu_count() or 2) - 1))
    print(f"[data] building {prefix}_{{train,valid,test}} from {source} (data.source, first use)", flush=True)
    config = PreprocessConfig(inputs=[source], tokenizer=tokenizer, output_prefix=prefix,
                              workers=workers, append_eod=append_eod, valid_fraction=valid_fraction,
                              test_fraction=test_fraction, progress=progress)
    run_preprocess(config)  # under its lock: a concurrent caller that finished first makes this a no-op
    _write_record(record, now)


SOURCE_RECORD = "_source.json"  # beside {prefix}_stats.json: the source file a build was made from


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


def _remove_build(prefix: str) -> None:
    """The shards, stats and record of one build (what preprocessing wrote at `prefix`)."""
    shard = re.compile(rf"^{re.escape(Path(prefix).name)}_(train|valid|test)(_\d{{5}})?\.(bin|idx)$")
    for path in Path(prefix).parent.iterdir():
        if shard.match(path.name) or path.name in (f"{Path(prefix).name}_stats.json",
                                                   f"{Path(prefix).name}{SOURCE_RECORD}"):
            path.unlink()


def _check_tokenizer(stats_path: str, tokenizer: str) -> None:
    with open(stats_path) as handle:
        built_with = json.load(handle).get("tokenizer_sha256")
    path = load_tokenizer(tokenizer).path  # the file, when `tokenizer` names a folder
    if built_with != file_sha256(path):
        raise ValueError(f"{stats_path}: these shards were tokenized with another tokenizer than {path}; "
                         f"remove {stats_path[: -len('_stats.json')]}_* to rebuild them")
