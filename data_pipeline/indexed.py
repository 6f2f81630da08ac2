"""megatron-core IndexedDataset files: naming, discovery and fast appends.

Naming convention: `{prefix}_{split}.bin/.idx`, or `{prefix}_{split}_{k:05d}.bin/.idx` when a
split is cut into shards.  Every document is stored as one sequence (document_indices = 0..n).
megatron-core is imported lazily: it is slow to import and only the writer and reader need it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import warnings
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from typing_extensions import Buffer

SHARD_SUFFIX = re.compile(r"_\d{5}$")


def import_megatron() -> None:
    """megatron.core.datasets, imported once without its import-time warnings and without W&B
    (implicit_megatron/utils/lean_imports.py): call it before importing from megatron.core."""
    from implicit_megatron.utils.lean_imports import import_megatron_datasets

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optional-kernel and deprecation notices from its import
        try:
            import_megatron_datasets()
        except ImportError as err:
            if "failed to map segment" not in str(err) and "Cannot allocate memory" not in str(err):
                raise
            raise MemoryError(f"torch, which megatron-core's shard reader and writer import, could not be loaded "
                              f"({str(err).splitlines()[0]})") from None


def megatron_indexed() -> tuple[Any, Any]:
    """(IndexedDataset, IndexedDatasetBuilder), megatron-core's writer and reader of shards."""
    import_megatron()
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    return IndexedDataset, IndexedDatasetBuilder


def token_dtype(vocab_size: int) -> type[np.integer]:
    """uint16 when every id fits, else int32 (megatron-core reads either from the .idx header)."""
    return np.uint16 if vocab_size <= 2**16 else np.int32


def split_prefix(prefix: str, split: str, shard: int | None = None) -> str:
    return f"{prefix}_{split}" if shard is None else f"{prefix}_{split}_{shard:05d}"


def find_shards(prefix: str, split: str) -> list[str]:
    """Every shard prefix of a split, in order: the single file, else all `_{k:05d}` shards."""
    single = split_prefix(prefix, split)
    if os.path.isfile(single + ".bin") and os.path.isfile(single + ".idx"):
        return [single]
    shards = sorted(path[: -len(".idx")] for path in glob.glob(glob.escape(single) + "_*.idx"))
    shards = [s for s in shards if SHARD_SUFFIX.search(s) and os.path.isfile(s + ".bin")]
    if not shards:
        raise FileNotFoundError(
            f"no {split} shards for prefix {prefix!r}: looked for {single}.bin/.idx and "
            f"{single}_00000.bin/.idx (a split without documents has none; {prefix}_stats.json lists "
            "what preprocessing wrote)")
    return shards


def existing_outputs(prefix: str, split: str) -> list[str]:
    """Files of a split that a run may replace: the single pair and any numbered shards."""
    single = split_prefix(prefix, split)
    found = [single + ext for ext in (".bin", ".idx") if os.path.exists(single + ext)]
    for path in glob.glob(glob.escape(single) + "_*"):
        stem, ext = os.path.splitext(path)
        if ext in (".bin", ".idx") and SHARD_SUFFIX.search(stem):
            found.append(path)
    return sorted(found)


def document_lengths(prefix: str) -> np.ndarray:
    """A copy of the per-document token counts of one file (int64)."""
    if os.path.getsize(prefix + ".bin") == 0:
        return np.zeros(0, dtype=np.int64)
    indexed_cls, _ = megatron_indexed()
    dataset = indexed_cls(prefix)  # keep it alive while copying: it unmaps its buffers when collected
    lengths = np.array(dataset.sequence_lengths, dtype=np.int64)
    del dataset
    return lengths


def append_documents(builder: Any, tokens: np.ndarray, lengths: np.ndarray) -> None:
    """Same bytes and index entries as `builder.add_document` once per document, in one write."""
    contiguous = cast("Buffer", np.ascontiguousarray(tokens, dtype=builder.dtype))  # numpy's stubs: __buffer__ on 3.12+
    builder.data_file.write(memoryview(contiguous).cast("B"))
    start = len(builder.sequence_lengths)
    builder.sequence_lengths.extend(lengths.tolist())
    builder.document_indices.extend(range(start + 1, start + 1 + len(lengths)))


def append_document_range(builder: Any, source_prefix: str, lengths: np.ndarray, start: int,
                          end: int, token_offset: int) -> None:
    """Copy documents [start, end) of another one-sequence-per-document file; `token_offset` is
    the number of tokens before document `start` (what `add_index` does for a whole file)."""
    itemsize = np.dtype(builder.dtype).itemsize
    count = int(lengths[start:end].sum())
    with open(source_prefix + ".bin", "rb") as source:
        source.seek(token_offset * itemsize)
        remaining = count * itemsize
        while remaining:
            chunk = source.read(min(remaining, 64 << 20))
            if not chunk:
                raise OSError(f"{source_prefix}.bin is shorter than its index says")
            builder.data_file.write(chunk)
            remaining -= len(chunk)
    first = len(builder.sequence_lengths)
    builder.sequence_lengths.extend(lengths[start:end].tolist())
    builder.document_indices.extend(range(first + 1, first + 1 + end - start))


class HashingWriter:
    """The builder's `.bin` file, hashed as it is written: a shard's sha256 costs no second read."""

    def __init__(self, file: Any) -> None:
        self.file, self.sha, self.bytes = file, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.bytes += memoryview(data).nbytes
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def fileno(self) -> int:
        return self.file.fileno()

    def close(self) -> None:
        self.file.close()


def finalize(builder: Any, idx_path: str) -> None:
    """Write the index and flush both files to disk before anyone renames them into place."""
    builder.data_file.flush()
    os.fsync(builder.data_file.fileno())
    builder.finalize(idx_path)
    with open(idx_path, "rb") as idx:
        os.fsync(idx.fileno())
