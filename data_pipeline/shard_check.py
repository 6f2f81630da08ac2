"""Is a shard whole? Its `.idx` read as megatron-core writes it and checked against its `.bin`.

megatron-core trusts the index: a `.bin` cut short fails hours later when a sample reaches the
missing part (without naming the file), and an index whose sizes were changed trains on the wrong
tokens without a word. `check_shard` reads the header and the three arrays (memory-mapped: no
token is read) and refuses, naming the file, anything that does not add up:

- the header: megatron-core's magic bytes, version 1, a dtype code it knows, of integers;
- the `.idx` size equals what its header's counts imply;
- every document length is non-negative, every pointer is the previous one plus the previous
  length times the dtype's size (from 0), the last document ends exactly at the end of the `.bin`;
- document indices run from 0 to the number of sequences, never decreasing.

The pre-launch check (`python -m implicit_megatron.config`, run by launch/pretrain.sh) and every
open of a shard for training (data_pipeline.packed) call it.
"""

from __future__ import annotations

import os
import shlex
import struct
from dataclasses import dataclass

import numpy as np

from implicit_megatron.utils.names import CONTROL_CHARACTERS

MAGIC = b"MMIDIDX\x00\x00"
HEADER_BYTES = 34  # magic 9, version 8, dtype code 1, sequence count 8, document count 8
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}  # megatron.core.datasets.indexed_dataset.DType


class ShardError(ValueError):
    """A shard whose files do not agree; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ShardInfo:
    prefix: str
    documents: int
    tokens: int
    dtype: type


def check_shard(prefix: str) -> ShardInfo:
    """Raise ShardError naming `{prefix}.idx` or `.bin` when they are not a whole megatron-core shard."""
    idx, bin_path = prefix + ".idx", prefix + ".bin"
    for path in (idx, bin_path):
        if not os.path.isfile(path):
            raise ShardError(f"{path}: missing")
    size = os.path.getsize(idx)
    with open(idx, "rb") as f:
        header = f.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES or header[:9] != MAGIC:
        raise ShardError(f"{idx}: not a megatron-core index (no MMIDIDX header)")
    version, code, sequences, documents = struct.unpack("<QBQQ", header[9:])
    if version != 1:
        raise ShardError(f"{idx}: index version {version}; megatron-core reads version 1")
    if code not in DTYPES:
        raise ShardError(f"{idx}: unknown token dtype code {code}")
    if not np.issubdtype(DTYPES[code], np.integer):
        raise ShardError(f"{idx}: token dtype code {code} is {np.dtype(DTYPES[code]).name}; token ids are integers "
                         "(not a token shard, or its header was edited)")
    expected = HEADER_BYTES + 12 * sequences + 8 * documents
    if size != expected:
        raise ShardError(f"{idx}: {size} bytes, but its header ({sequences} sequences, {documents} document "
                         f"indices) implies {expected}: cut short or garbled")
    dtype = DTYPES[code]
    item = np.dtype(dtype).itemsize
    lengths = np.memmap(idx, dtype=np.int32, mode="r", offset=HEADER_BYTES, shape=(sequences,)) if sequences else \
        np.zeros(0, np.int32)
    pointers = np.memmap(idx, dtype=np.int64, mode="r", offset=HEADER_BYTES + 4 * sequences, shape=(sequences,)) \
        if sequences else np.zeros(0, np.int64)
    docs = np.memmap(idx, dtype=np.int64, mode="r", offset=HEADER_BYTES + 12 * sequences, shape=(documents,)) \
        if documents else np.zeros(0, np.int64)
    if sequences and lengths.min() < 0:
        raise ShardError(f"{idx}: negative document lengths (garbled)")
    ends = np.cumsum(lengths, dtype=np.int64) * item
    if sequences and (pointers[0] != 0 or not np.array_equal(pointers[1:], ends[:-1])):
        raise ShardError(f"{idx}: document offsets do not follow from the lengths (garbled or edited)")
    data_bytes = int(ends[-1]) if sequences else 0
    bin_size = os.path.getsize(bin_path)
    if data_bytes != bin_size:
        raise ShardError(f"{bin_path}: {bin_size} bytes, but {idx} describes {data_bytes} "
                         f"({data_bytes // item} tokens of {np.dtype(dtype).name}): "
                         f"{'cut short' if bin_size < data_bytes else 'longer than its index'}")
    if documents and (docs[0] != 0 or docs[-1] != sequences or np.any(np.diff(docs) < 0)):
        raise ShardError(f"{idx}: document indices do not run from 0 to {sequences} (garbled)")
    return ShardInfo(prefix, max(documents - 1, 0), data_bytes // item, dtype)


def check_build(prefix: str) -> None:
    """Raise ShardError when the shards of `prefix` are not a finished build of data_pipeline.preprocess:
    its `_stats.json` records an incomplete build (an input could not be read to its end), or its
    work folder is still there without stats (a run killed after publishing the shards, before its
    stats). Shards made by other tools (no stats, no work folder) pass: they are checked by shard."""
    import json

    stats_path, work = f"{prefix}_stats.json", f"{prefix}.work"
    if os.path.isfile(stats_path):
        try:
            with open(stats_path, "rb") as handle:
                stats = json.loads(handle.read().decode("utf-8"))
        except (OSError, ValueError) as err:
            raise ShardError(f"{stats_path}: not readable ({type(err).__name__}); it should record how the "
                             f"shards of {prefix} were built: run their preprocessing again") from None
        if isinstance(stats, dict) and stats.get("incomplete"):
            raise ShardError(f"{stats_path}: the build of these shards is incomplete (an input could not be read "
                             f"to its end; {stats.get('skipped', {}).get('unreadable_file', '?')} unreadable): "
                             f"repair or replace it, then complete them with: {preprocess_command(prefix, stats)}")
    elif os.path.isdir(work):
        raise ShardError(f"{prefix}: shards of a preprocessing run that ended before writing {stats_path} (its "
                         f"work folder {work} is still there): run the same preprocessing command again to "
                         "complete them (it resumes)")


def preprocess_command(prefix: str, stats: dict) -> str:
    """The data_pipeline.preprocess command that built (and resumes) the shards `stats` describes, to
    paste into a shell: the stats file may come from someone else, so every value is one quoted word
    with its control characters removed (nothing in it runs, nothing rewrites the terminal)."""
    inputs = stats.get("inputs")
    args = ["--input", *(inputs if isinstance(inputs, list) and inputs else ["INPUT"]), "--tokenizer",
            stats.get("tokenizer", "TOKENIZER"), "--output-prefix", prefix]
    if stats.get("append_eod"):
        args.append("--append-eod")
    for flag, key, default in (("--valid-fraction", "valid_fraction", 0.0),
                               ("--test-fraction", "test_fraction", 0.001),
                               ("--max-shard-tokens", "max_shard_tokens", None), ("--text-key", "text_key", "text"),
                               ("--eod-token", "eod_token", None), ("--limit-docs", "limit_docs", None)):
        if stats.get(key, default) != default:
            args += [flag, stats[key]]
    words = [CONTROL_CHARACTERS.sub("", str(arg)) for arg in args]
    return "python -m data_pipeline.preprocess " + shlex.join(words)
