"""Input discovery and raw reading: files, `save_to_disk` folders and streamed hub datasets.

Reading is kept cheap on purpose: JSON lines leave here as undecoded blocks of whole lines and
columnar inputs as Arrow arrays, so that splitting, parsing and tokenization happen in the worker
processes and one reader can feed many workers.  A file that fails while being read yields an
`Unreadable` marker instead of raising, so one bad file never stops a run.
"""

from __future__ import annotations

import glob
import gzip
import io
import lzma
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

JSONL_SUFFIXES = tuple(f".{base}{comp}" for base in ("jsonl", "json") for comp in ("", ".zst", ".gz", ".xz"))
PARQUET_SUFFIXES = (".parquet",)
HUB_SCHEME = "hf:"
DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
READ_SIZE = 1 << 18  # a failing compressed file loses at most this much text before the failure
FORMATS_HELP = ("JSON lines (.jsonl/.json, optionally .zst/.gz/.xz), .parquet, a datasets save_to_disk "
                "folder, or hf:NAME[:CONFIG][#SPLIT] for a hub dataset")


# a datasets DatasetDict's split names -> the shards' splits: its splits are used as they are
DATASET_SPLITS = {"train": "train", "validation": "valid", "valid": "valid", "dev": "valid", "test": "test"}


class InputError(ValueError):
    """An input argument that cannot be used (no match, unknown format); found before any work."""


@dataclass(frozen=True)
class InputSpec:
    """One input: a file or folder path (or hub name) and how to read it."""

    location: str
    kind: str  # "jsonl" | "parquet" | "disk" | "hub"

    def identity(self) -> list:
        """What decides whether finished work for this input can be reused: path, size, mtime."""
        if self.kind == "hub":
            return [self.location]
        path = Path(self.location)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return [str(path.resolve())] + [[str(p.relative_to(path)) if path.is_dir() else p.name,
                                         p.stat().st_size, p.stat().st_mtime_ns] for p in files]


@dataclass
class RawBatch:
    """Consecutive raw records of one input; `first` numbers the first record (line or row)."""

    source: str
    unit: str  # "line" (1-based) or "row" (0-based)
    first: int
    kind: str  # "chunk": undecoded JSON lines in one bytes block; "values": the text field's values
    items: Any  # bytes, a list of values, or a pyarrow Array
    split: str | None = None  # the split every record goes to (a DatasetDict's); None: by hash of its text

    def records(self) -> list:
        """One entry per line or row: the raw line (bytes) or the text field's value."""
        if self.kind == "chunk":
            lines = self.items.split(b"\n")
            return lines[:-1] if lines and not lines[-1] else lines
        return self.items.to_pylist() if hasattr(self.items, "to_pylist") else list(self.items)

    def location(self, i: int) -> str:
        return f"{self.source}:{self.unit} {self.first + i}"


@dataclass
class Unreadable:
    """Reading stopped early: the rest of this input is skipped (and counted)."""

    location: str
    message: str


def kind_of(path: str) -> str | None:
    """The reader for a path, from its suffix or folder markers; None when unknown."""
    if path.startswith(HUB_SCHEME):
        return "hub"
    name = path.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in DISK_MARKERS):
        return "disk"
    return None


def resolve_inputs(patterns: list[str]) -> list[InputSpec]:
    """Expand paths and globs (sorted, duplicates dropped) and check every format up front."""
    if not patterns:
        raise InputError("--input: no input given")
    specs: list[InputSpec] = []
    seen: set[str] = set()
    for pattern in patterns:
        if pattern.startswith(HUB_SCHEME):
            matches = [pattern]
        elif glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern, recursive=True))
        else:
            matches = [pattern] if os.path.exists(pattern) else []
        if not matches:
            raise InputError(f"--input: no input matches {pattern!r}")
        for match in matches:
            kind = kind_of(match)
            if kind is None:
                raise InputError(f"--input: unknown input format: {match} (expected {FORMATS_HELP})")
            if kind == "disk":
                dataset_dict_splits(match)  # a split that is none of ours is refused before any work
            key = match if kind == "hub" else os.path.realpath(match)
            if key not in seen:
                seen.add(key)
                specs.append(InputSpec(match, kind))
    return specs


def dataset_dict_splits(path: str) -> dict[str, str] | None:
    """{its split: ours} of a DatasetDict's save_to_disk folder (None for a single Dataset's): each
    record goes to the split its own split names, never re-split by hash with the others."""
    import json

    marker = Path(path) / "dataset_dict.json"
    if not marker.is_file():
        return None
    try:
        names = list(json.loads(marker.read_text())["splits"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"--input: {marker}: not a datasets DatasetDict description ({err})") from None
    unknown = [name for name in names if name not in DATASET_SPLITS]
    if unknown:
        raise InputError(f"--input: {path} is a DatasetDict with the split(s) {', '.join(unknown)}, which are none of "
                         f"train, validation (valid, dev) or test: give the folder of each split to use instead "
                         f"(--input {os.path.join(path, unknown[0])}), whose documents --valid-fraction and "
                         f"--test-fraction then split")
    return {name: DATASET_SPLITS[name] for name in names}


def first_record_fields(spec: InputSpec) -> list[str] | None:
    """The fields of an input's first record (its columns, for columnar inputs), to say which text
    key a corpus has when --text-key found none; None where that cannot be read."""
    import json

    try:
        if spec.kind == "jsonl":
            for batch in _jsonl_batches(spec.location, 1 << 16, [0]):
                for line in batch.records():
                    if line.strip():
                        record = json.loads(line)
                        return sorted(record) if isinstance(record, dict) else None
            return None
        if spec.kind == "parquet":
            import pyarrow.parquet as pq

            return list(pq.ParquetFile(spec.location).schema_arrow.names)
        if spec.kind == "disk":
            import datasets

            return list(datasets.load_from_disk(spec.location).column_names)
    except Exception:  # noqa: BLE001 - only for a message: an input that cannot be read says so elsewhere
        return None
    return None


def read_batches(spec: InputSpec, text_key: str, batch_docs: int = 512,
                 batch_bytes: int = 1 << 20) -> Iterator[RawBatch | Unreadable]:
    """Raw batches of one input, in order; an `Unreadable` marker ends a failing input.

    JSON lines come in blocks of about `batch_bytes`, columnar inputs in `batch_docs` rows."""
    readers = {"parquet": _parquet_batches, "disk": _disk_batches, "hub": _hub_batches}
    done = [0]  # records read so far, to locate a read failure
    try:
        if spec.kind == "jsonl":
            yield from _jsonl_batches(spec.location, batch_bytes, done)
        else:
            yield from readers[spec.kind](spec.location, text_key, batch_docs, done)
    except Exception as err:  # any failure to read (I/O, decompression, Arrow): skip the rest
        where = f"line {done[0] + 1}" if spec.kind == "jsonl" else f"row {done[0]}"
        yield Unreadable(f"{spec.location}:{where}", f"{type(err).__name__}: {err}")


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file, frame after frame; a file that ends inside a frame (cut
    short) raises EOFError at its end, as gzip and lzma do (zstandard's stream reader just stops)."""

    def __init__(self, path: str) -> None:
        import zstandard

        self._raw = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._frame: zstandard.ZstdDecompressionObj | None = None
        self._out = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(READ_SIZE), b""))
        while not self._out:
            data = self._raw.read(READ_SIZE)
            if not data:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("compressed file ended inside a zstd frame (cut short?)")
                return b""
            while data:
                if self._frame is None or self._frame.eof:
                    self._frame = self._new()
                self._out += self._frame.decompress(data)
                data = self._frame.unused_data if self._frame.eof else b""
        out, self._out = self._out[:size], self._out[size:]
        return out

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_binary(path: str) -> io.RawIOBase | io.BufferedIOBase | BinaryIO:
    """A binary stream over a possibly compressed file (by suffix); `read(n)` may return less."""
    name = path.lower()
    if name.endswith(".zst"):
        return ZstdFrames(path)
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - the caller closes it


def _jsonl_batches(path: str, batch_bytes: int, done: list[int]) -> Iterator[RawBatch]:
    """Blocks of whole lines (split by the workers): the reader does no per-line work."""
    with open_binary(path) as stream:
        pieces: list[bytes] = []
        size = 0
        first = 1
        try:
            while piece := stream.read(READ_SIZE):
                size += len(piece)
                cut = piece.rfind(b"\n") + 1 if size >= batch_bytes else 0
                if not cut:
                    pieces.append(piece)
                    continue
                block = b"".join([*pieces, piece[:cut]])
                yield RawBatch(path, "line", first, "chunk", block)
                first += block.count(b"\n")
                done[0] = first - 1
                pieces, size = [piece[cut:]], len(piece) - cut
        except Exception:
            block = b"".join(pieces)
            cut = block.rfind(b"\n") + 1
            if cut:  # keep the whole lines read before the failure
                yield RawBatch(path, "line", first, "chunk", block[:cut])
                done[0] = first - 1 + block.count(b"\n", 0, cut)
            raise
        if size:
            yield RawBatch(path, "line", first, "chunk", b"".join(pieces))


def _parquet_batches(path: str, text_key: str, batch_docs: int, done: list[int]) -> Iterator[RawBatch]:
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as parquet:
        if text_key not in parquet.schema_arrow.names:  # every row lacks the field
            yield from _missing_field(path, parquet.metadata.num_rows, batch_docs, done)
            return
        for batch in parquet.iter_batches(batch_size=batch_docs, columns=[text_key]):
            yield RawBatch(path, "row", done[0], "values", batch.column(0))
            done[0] += batch.num_rows


def _disk_batches(path: str, text_key: str, batch_docs: int, done: list[int]) -> Iterator[RawBatch]:
    import datasets

    loaded = datasets.load_from_disk(path)
    parts = [(name, loaded[name]) for name in sorted(loaded)] if isinstance(loaded, datasets.DatasetDict) \
        else [("", loaded)]
    for name, dataset in parts:
        source = f"{path}[{name}]" if name else path
        done[0] = 0
        if text_key not in dataset.column_names:
            yield from _missing_field(source, dataset.num_rows, batch_docs, done)
            continue
        split = DATASET_SPLITS[name] if name else None
        for table in dataset.select_columns([text_key]).with_format("arrow").iter(batch_size=batch_docs):
            yield RawBatch(source, "row", done[0], "values", table.column(0).combine_chunks(), split)
            done[0] += table.num_rows


def _hub_batches(name: str, text_key: str, batch_docs: int, done: list[int]) -> Iterator[RawBatch]:
    """hf:NAME[:CONFIG][#SPLIT], streamed (needs the hub to be reachable)."""
    import datasets

    spec, _, split = name[len(HUB_SCHEME):].partition("#")
    dataset_name, _, config = spec.partition(":")
    stream = datasets.load_dataset(dataset_name, config or None, split=split or "train", streaming=True)
    for batch in stream.iter(batch_size=batch_docs):
        values = batch.get(text_key)
        count = len(next(iter(batch.values()))) if batch else 0
        yield RawBatch(name, "row", done[0], "values", values if values is not None else [None] * count)
        done[0] += count


def _missing_field(source: str, rows: int, batch_docs: int, done: list[int]) -> Iterator[RawBatch]:
    for start in range(0, rows, batch_docs):
        yield RawBatch(source, "row", start, "values", [None] * min(batch_docs, rows - start))
        done[0] = start + min(batch_docs, rows - start)
