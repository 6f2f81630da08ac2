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

The pre-launch check (`python -m implicit_megatron.config`, and the launch's) and every
open of a shard for training (data_pipeline.packed) call it.

A build of data_pipeline.preprocess also records, in `{prefix}_stats.json`, each shard file's size
and sha256 (hashed while it was written). `check_build` compares the sizes at every open and lists
a shard file the stats do not; the digests are compared where asked (`data.verify_shards`, or
`python -m data_pipeline.shard_check --verify PREFIX ...`, which exits 1 naming the file), since
that reads every byte.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import struct
import sys
from dataclasses import dataclass

import numpy as np

from data_pipeline.indexed import existing_outputs, find_shards
from data_pipeline.splits import SPLITS
from implicit_megatron.utils.names import CONTROL_CHARACTERS
from implicit_megatron.utils.received_file import UnreadableFile, read_small_json

MAGIC = b"MMIDIDX\x00\x00"
MAX_STATS_BYTES = 16 * 2**20  # a build's stats: counts, inputs and one line per shard file
HEADER_BYTES = 34  # magic 9, version 8, dtype code 1, sequence count 8, document count 8
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}  # megatron.core.datasets.indexed_dataset.DType


class ShardError(ValueError):
    """A shard whose files do not agree; the message names the file and what is wrong."""


class ShardReadError(ValueError):
    """A shard could not be indexed or read; the message names its prefix (or the index cache's file)."""


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


def read_stats(prefix: str) -> dict | None:
    """`{prefix}_stats.json` (None: there is none); ShardError naming it when it is not a JSON object."""
    stats_path = f"{prefix}_stats.json"
    if not os.path.lexists(stats_path):
        return None
    try:
        stats = read_small_json(stats_path, MAX_STATS_BYTES, "the stats of a preprocessing run")
    except UnreadableFile as err:
        raise ShardError(f"{err}; it should record how the shards of {prefix} were built: run their "
                         "preprocessing again") from None
    if not isinstance(stats, dict):
        raise ShardError(f"{stats_path}: not a JSON object; it should record how the shards of {prefix} were built")
    return stats


def check_build(prefix: str, verify: bool = False) -> None:
    """Raise ShardError when the shards of `prefix` are not a finished build of data_pipeline.preprocess:
    its `_stats.json` records an incomplete build (an input could not be read to its end), or its
    work folder is still there without stats (a run killed after publishing the shards, before its
    stats), or its shard files are not the ones it records (check_recorded_files). Shards made by
    other tools (no stats, no work folder) pass: they are checked by shard."""
    stats_path, work = f"{prefix}_stats.json", f"{prefix}.work"
    stats = read_stats(prefix)
    if stats is not None:
        if stats.get("incomplete"):
            skipped = stats.get("skipped")
            unreadable = skipped.get("unreadable_file", "?") if isinstance(skipped, dict) else "?"
            raise ShardError(f"{stats_path}: the build of these shards is incomplete (an input could not be read "
                             f"to its end; {unreadable} unreadable): repair or replace it, then complete them "
                             f"with: {preprocess_command(prefix, stats)}")
        check_recorded_files(prefix, stats, verify)
    elif os.path.isdir(work):
        raise ShardError(f"{prefix}: shards of a preprocessing run that ended before writing {stats_path} (its "
                         f"work folder {work} is still there): run the same preprocessing command again to "
                         "complete them (it resumes)")


def check_recorded_files(prefix: str, stats: dict, verify: bool) -> None:
    """Every shard file of `prefix` is one `_stats.json` lists ("files"), at its recorded size; with
    `verify`, at its recorded sha256 too (a read of every byte: a flipped bit is seen). Stats of
    older builds record no files: sizes are then checked by shard only, and verify says so."""
    stats_path = f"{prefix}_stats.json"
    files = stats.get("files")
    if files is None:
        if verify:
            raise ShardError(f"{stats_path}: records no digests of its shard files (built by an older version): "
                             "there is nothing to verify them against; rebuild the shards to record them")
        return
    if not isinstance(files, dict):
        raise ShardError(f"{stats_path}: \"files\" is not an object of file names")
    folder, stem = os.path.dirname(prefix), os.path.basename(prefix) + "_"
    for name, record in files.items():
        if (not isinstance(name, str) or os.path.basename(name) != name or not name.startswith(stem)
                or not name.endswith((".bin", ".idx"))):
            raise ShardError(f"{stats_path}: \"files\" lists {name!r}, not a shard file of {prefix}")
        if (not isinstance(record, dict) or type(record.get("bytes")) is not int
                or not isinstance(record.get("sha256"), str) or len(record["sha256"]) != 64):
            raise ShardError(f"{stats_path}: \"files\".{name} is not {{\"bytes\": int, \"sha256\": 64 hex digits}}")
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ShardError(f"{path}: missing ({stats_path} lists it)")
        size = os.path.getsize(path)
        if size != record["bytes"]:
            how = "cut short" if size < record["bytes"] else "longer than when it was built"
            raise ShardError(f"{path}: {size} bytes, but {stats_path} records {record['bytes']}: {how} (copy the "
                             "shards again, or rebuild them)")
        if verify and file_sha256(path) != record["sha256"]:
            raise ShardError(f"{path}: its content is not what {stats_path} records (another sha256): changed "
                             "since the build, a flipped bit or an edit; copy the shards again, or rebuild them")
    for split in SPLITS:
        for path in existing_outputs(prefix, split):
            if os.path.basename(path) not in files:
                raise ShardError(f"{path}: a shard file that {stats_path} does not list (added after the build); "
                                 "remove it, or rebuild the shards")


def file_sha256(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            sha.update(block)
    return sha.hexdigest()


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


def main(argv: list[str] | None = None) -> int:
    """Check every shard of each prefix; with --verify, against the sha256 digests its stats record."""
    parser = argparse.ArgumentParser(prog="python -m data_pipeline.shard_check", description=main.__doc__)
    parser.add_argument("prefixes", nargs="+", metavar="PREFIX", help="a preprocessing --output-prefix")
    parser.add_argument("--verify", action="store_true",
                        help="read every byte and compare each file's sha256 with {PREFIX}_stats.json")
    args = parser.parse_args(argv)
    failed = 0
    for prefix in args.prefixes:
        try:
            check_build(prefix, args.verify)
            shards = [s for split in SPLITS for s in _shards_or_none(prefix, split)]
            if not shards:
                raise ShardError(f"{prefix}: no shards ({prefix}_train.bin/.idx or {prefix}_train_00000.bin/.idx)")
            tokens = sum(check_shard(shard).tokens for shard in shards)
        except ShardError as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
            continue
        print(f"{prefix}: {len(shards)} shards, {tokens:,} tokens: whole{', digests verified' if args.verify else ''}")
    return 1 if failed else 0


def _shards_or_none(prefix: str, split: str) -> list[str]:
    try:
        return find_shards(prefix, split)
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    sys.exit(main())
