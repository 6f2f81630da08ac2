"""Packed language-model samples over tokenized shards, for training and evaluation.

The API the training loop uses::

    from data_pipeline.packed import build_packed_dataset, build_eval_datasets, DistributedBatchIterator

    train = build_packed_dataset(["data/pile/neox"], None, "train", seq_len=2048, seed=1234,
                                 num_samples=steps * global_batch_size)
    len(train); train[i]              # np.ndarray[int64] of seq_len + 1 tokens
    batches = DistributedBatchIterator(train, micro_batch_size, dp_rank, dp_size, grad_accum,
                                       consumed_samples=0)
    for batch in batches:             # torch.LongTensor (micro_batch_size, seq_len + 1)
        inputs, labels = batch[:, :-1], batch[:, 1:]
    state = batches.state_dict()      # {"consumed_samples": ..., ...}; load_state_dict(state) resumes
    evals = build_eval_datasets(["data/pile/neox"], "test", (4096, 8192, 16384), seed=1234)

Semantics (megatron-core's GPTDataset, which builds and caches the indices):

- A prefix names the shards `{prefix}_{split}` or `{prefix}_{split}_{k:05d}` (all are used).
- Per shard and epoch, the documents are shuffled (seeded) and concatenated, EOD tokens included
  as written; sample j of the epoch is tokens [j*seq_len, (j+1)*seq_len] of that stream, so
  consecutive samples share one token (the last label of one is the first input of the next),
  samples cross document boundaries, and the final (tokens - 1) mod seq_len tokens of an epoch
  are dropped.  The order of samples is then shuffled (seeded).
- `num_samples=None` gives exactly one epoch of every shard; a larger `num_samples` repeats
  epochs (each with a new document order) until it is met.
- Several shards or prefixes are blended by weight (prefix weights, shared among a prefix's
  shards by their token counts; None: in proportion to tokens) with megatron-core's
  deterministic blending index, built in memory.
- Everything depends only on (shards, seq_len, seed, num_samples): every rank and every restart
  sees the same sample i.  Index files are cached in `cache_dir` (default: this user's cache,
  data_pipeline.index_cache; an `index-cache/` beside the shards is never read);
  with torch.distributed initialised, rank 0 builds them first and the other ranks wait at a
  barrier, so call this on all ranks (a rank that does not see rank 0's cache builds its own).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from data_pipeline.batches import DistributedBatchIterator
from data_pipeline.index_cache import (
    LOCK,
    cached_before,
    check_entries,
    check_indices,
    check_order,
    index_cache_dir,
    prepare_index_cache,
    say_received_ignored,
)
from data_pipeline.indexed import find_shards, import_megatron
from data_pipeline.locking import exclusive_lock
from data_pipeline.shard_check import ShardReadError, check_build, check_shard, read_stats
from data_pipeline.splits import SPLITS

BLEND_SURPLUS = 0.005  # extra samples built per shard so the blend never runs short (megatron's default)
__all__ = ["PackedDataset", "build_packed_dataset", "build_eval_datasets", "DistributedBatchIterator",
           "ShardReadError", "index_cache_dir"]



class PackedDataset:
    """`len()` samples of `seq_len + 1` tokens; sample i is the same on every rank and run."""

    def __init__(self, parts: list[Any], seq_len: int, length: int,
                 blend: tuple[np.ndarray, np.ndarray] | None, names: list[str] | None = None) -> None:
        self.parts, self.seq_len, self.length, self.blend = parts, seq_len, length, blend
        self.names = names or [getattr(p, "dataset_path", "?") for p in parts]  # each part's shard prefix
        self.sizes = [_file_sizes(name) for name in self.names]  # as opened: see __getitem__

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"sample {index} is out of range for {self.length} samples")
        which, sample = (0, index) if self.blend is None else (int(self.blend[0][index]), int(self.blend[1][index]))
        # The shard is read through a memory map: a file cut after it was opened would end the process
        # with SIGBUS and not a word, so its size is compared first (two stat calls per sample).
        was = self.sizes[which]
        now = _file_sizes(self.names[which]) if was is not None else None
        if now != was:
            raise ShardReadError(f"{self.names[which]}: its .bin/.idx were {was} bytes when this process opened them "
                                 f"and are {now} now: the shard changed under the running job (cut, rewritten or "
                                 "removed); put it back as it was and launch again (a run resumes from its last "
                                 "checkpoint)")
        try:
            item = self.parts[which][sample]  # tokens = text[:-1], labels = text[1:]
        except (IndexError, ValueError, OSError, RuntimeError) as err:
            raise ShardReadError(f"{self.names[which]}: reading sample {sample} failed ({type(err).__name__}: {err}); "
                                 "the shard may have changed or be damaged: check it with python -m "
                                 "implicit_megatron.config CONFIG (it checks every shard)") from None
        return np.concatenate([item["tokens"].numpy(), item["labels"][-1:].numpy()]).astype(np.int64)


def _file_sizes(prefix: str) -> tuple[int, int] | None:
    """(.bin size, .idx size) of a shard prefix; None where either file is missing."""
    try:
        return os.stat(prefix + ".bin").st_size, os.stat(prefix + ".idx").st_size
    except OSError:
        return None


class TooFewTokens(ValueError):
    """A split that holds fewer tokens than one sample (seq_len + 1)."""


def build_packed_dataset(prefixes: Sequence[str], weights: Sequence[float] | None, split: str, seq_len: int,
                         seed: int, num_samples: int | None = None,
                         cache_dir: str | None = None) -> PackedDataset:
    """Samples of `seq_len + 1` tokens from the `split` shards of `prefixes` (see the module doc)."""
    if not prefixes:
        raise ValueError("no data prefixes given")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if weights is not None and len(weights) != len(prefixes):
        raise ValueError(f"{len(weights)} weights for {len(prefixes)} prefixes")
    if seq_len < 1 or (num_samples is not None and num_samples < 1):
        raise ValueError(f"seq_len and num_samples must be positive, got {seq_len} and {num_samples}")
    shards, shard_weights, shard_tokens = _shards_with_weights(prefixes, weights, split)
    one_epoch = [max(0, (t - 1) // seq_len) for t in shard_tokens]
    if sum(one_epoch) == 0:
        raise TooFewTokens(f"the {split} split of {list(prefixes)} holds {sum(shard_tokens)} tokens, fewer "
                           f"than one sample of {seq_len + 1}")
    blended = len(shards) > 1
    if blended and num_samples is None and weights is not None:
        num_samples = sum(one_epoch)  # an epoch-sized blend that follows the given weights
    if not blended:
        per_shard = [num_samples]
    elif num_samples is None:
        per_shard = [None] * len(shards)
    else:
        per_shard = [math.ceil(math.ceil(num_samples * w) * (1 + BLEND_SURPLUS)) for w in shard_weights]
    keep = [i for i, n in enumerate(one_epoch) if n > 0 and per_shard[i] != 0]
    config = _config(prefixes, shards, split, seq_len, seed, index_cache_dir(prefixes, cache_dir))
    say_received_ignored(prefixes, config.path_to_cache)
    parts = _build_in_rank_order(lambda: [_gpt_dataset(shards[i], split, per_shard[i], config) for i in keep],
                                 config.path_to_cache)
    names = [shards[i] for i in keep]
    if not blended:
        return PackedDataset(parts, seq_len, num_samples or len(parts[0]), None, names)
    if num_samples is None:  # every shard exactly once
        return PackedDataset(parts, seq_len, sum(len(p) for p in parts), _exhaustive_blend(parts), names)
    return PackedDataset(parts, seq_len, num_samples,
                         _weighted_blend(parts, [shard_weights[i] for i in keep], num_samples), names)


def build_eval_datasets(prefixes: Sequence[str], split: str, seq_lens: Sequence[int], seed: int,
                        cache_dir: str | None = None) -> dict[int, PackedDataset]:
    """One epoch of `split` at each length (e.g. 4096-16384 for length extrapolation)."""
    return {L: build_packed_dataset(prefixes, None, split, L, seed, None, cache_dir) for L in seq_lens}


# ------------------------------------------------------------------ shards and megatron-core objects


def epochs_planned(prefixes: Sequence[str], weights: Sequence[float] | None, seq_len: int,
                   num_samples: int) -> tuple[float, int]:
    """(epochs, train tokens): how many times `num_samples` training samples of seq_len + 1 read the
    train split, for the shard read most often under the blend's weights; and the split's tokens."""
    _, shard_weights, tokens = _shards_with_weights(prefixes, weights, "train")
    epochs = [num_samples * w / ((t - 1) // seq_len) if (t - 1) // seq_len > 0 else (math.inf if w else 0.0)
              for w, t in zip(shard_weights, tokens, strict=True)]
    return max(epochs, default=0.0), sum(tokens)


def split_tokens(prefixes: Sequence[str], split: str) -> int:
    """The tokens of one split over every prefix (0 where a prefix has none of it)."""
    total = 0
    for prefix in prefixes:
        try:
            total += sum(check_shard(shard).tokens for shard in find_shards(prefix, split))
        except FileNotFoundError:  # made without this split (--valid-fraction 0, say)
            continue
    return total


def _shards_with_weights(prefixes: Sequence[str], weights: Sequence[float] | None,
                         split: str) -> tuple[list[str], list[float], list[int]]:
    shards: list[str] = []
    tokens: list[int] = []
    owner: list[int] = []
    for p, prefix in enumerate(prefixes):
        check_build(prefix)  # an incomplete build is refused by name, as by the pre-launch check
        for shard in find_shards(prefix, split):
            shards.append(shard)
            tokens.append(check_shard(shard).tokens)  # a shard that does not add up is refused by name
            owner.append(p)
    prefix_tokens = [sum(t for t, o in zip(tokens, owner) if o == p) for p in range(len(prefixes))]
    if weights is None:
        prefix_share = [t / max(sum(prefix_tokens), 1) for t in prefix_tokens]
    else:
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights must be non-negative and not all zero, got {list(weights)}")
        prefix_share = [w / sum(weights) for w in weights]
    shard_weights = [prefix_share[o] * t / prefix_tokens[o] if prefix_tokens[o] else 0.0
                     for t, o in zip(tokens, owner)]
    return shards, shard_weights, tokens


class _DataIdentity:
    """What megatron-core's config reads from a tokenizer: the EOD id, and a JSON identity that
    keys its index cache: each shard's .bin by size and modification time, and its .idx (which holds
    the document boundaries the cached indices follow) by a digest of its whole content, so that a
    rebuilt, swapped or edited index never reuses stale indices (the .idx is small: 20 bytes a
    document, hashed at over 1 GB/s)."""

    def __init__(self, eod: int, shards: list[str]) -> None:
        self.eod = eod
        self.vocab_size = None  # the token dtype is read from each .idx file
        files = {s: {"bin": _stat(s + ".bin"), "idx": _content_digest(s + ".idx")} for s in shards}
        self.unique_identifiers = {"class": "PackedShards", "eod": eod, "shards": files}


def _stat(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def _content_digest(path: str, chunk: int = 1 << 24) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            sha.update(block)
    return sha.hexdigest()


def _config(prefixes: Sequence[str], shards: list[str], split: str, seq_len: int, seed: int,
            cache_dir: str) -> Any:
    import_megatron()
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    blend = (shards, None)
    return GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_len, path_to_cache=cache_dir,
        blend_per_split=[blend if name == split else None for name in SPLITS],  # megatron's Split order
        tokenizer=_DataIdentity(_eod_of(prefixes), shards), reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)


def _eod_of(prefixes: Sequence[str]) -> int:
    """The EOD id recorded by preprocessing (only used by megatron-core for masks we do not use)."""
    eod = (read_stats(prefixes[0]) or {}).get("eod_id")
    return eod if type(eod) is int else 0


def _gpt_dataset(shard: str, split: str, num_samples: int | None, config: Any) -> Any:
    import_megatron()
    from megatron.core.datasets.gpt_dataset import GPTDataset
    from megatron.core.datasets.utils import Split

    try:
        indexed = GPTDataset.build_low_level_dataset(shard, config)
        documents = np.arange(len(indexed.sequence_lengths), dtype=np.int32)
        began = time.time()
        dataset = GPTDataset(indexed, shard, documents, num_samples, Split[split], config)
    except (IndexError, ValueError, OSError, RuntimeError, AssertionError) as err:
        raise ShardReadError(f"{shard}: building its packed-sample index failed ({type(err).__name__}: {err}); "
                             "the shard may be damaged: check it with python -m implicit_megatron.config CONFIG "
                             f"(it checks every shard), or remove the index cache {config.path_to_cache}") from None
    check_indices(dataset)
    if dataset.shuffle_index is not None and cached_before(dataset, began):  # read, not built here
        check_order(dataset)
    return dataset


def _build_in_rank_order(build, cache_dir: str) -> Any:
    """Build under a file lock; with torch.distributed up, rank 0 first (it writes the cache)."""
    import torch.distributed as dist

    prepare_index_cache(cache_dir)
    lock = os.path.join(cache_dir, LOCK)

    def checked_build():
        check_entries(cache_dir)  # under the lock: no entry is half-written by another process
        return build()

    if not (dist.is_available() and dist.is_initialized()):
        with exclusive_lock(lock):
            return checked_build()
    result = None
    if dist.get_rank() == 0:
        with exclusive_lock(lock):
            result = checked_build()
    dist.barrier()
    if dist.get_rank() != 0:
        with exclusive_lock(lock):
            result = checked_build()
    return result


def _weighted_blend(parts: list[Any], weights: list[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    import_megatron()
    from megatron.core.datasets import helpers

    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    normalized = np.array(weights, dtype=np.float64) / sum(weights)
    helpers.build_blending_indices(dataset_index, sample_index, normalized, len(parts), size, False)
    for i, part in enumerate(parts):
        used = int(np.count_nonzero(dataset_index == i))
        if used > len(part):
            raise IndexError(f"the blend draws {used} samples from {part.dataset_path}, which has {len(part)}")
    return dataset_index, sample_index


def _exhaustive_blend(parts: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    import_megatron()
    from megatron.core.datasets import helpers

    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    dataset_index = np.zeros(int(sizes.sum()), dtype=np.int16)
    sample_index = np.zeros(int(sizes.sum()), dtype=np.int64)
    helpers.build_exhaustive_blending_indices(dataset_index, sample_index, sizes, len(parts))
    return dataset_index, sample_index
