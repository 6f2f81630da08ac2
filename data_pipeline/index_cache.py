"""Where megatron-core's packed-sample index cache lives, and what is read from it.

megatron-core keys its cached arrays by a hash of the shards' identity (their `.idx` content and
`.bin` sizes, see packed._DataIdentity), reads them with numpy.load(allow_pickle=True), and writes
them with open(path, "wb"), through whatever a name there points at. So a cache is as trusted as
the folder it sits in:

- By default it is this user's: `$XDG_CACHE_HOME/implicit-megatron/index-cache/` (`~/.cache`),
  made with mode 0700. An `index-cache/` beside the shards (written by older versions, or by
  whoever sent the shards) is never read nor written; a note says so once per process.
- `data.index_cache` names another folder; it is used only when it is this user's and not writable
  by others.
- Before megatron-core reads anything, every entry of the folder is checked: no symbolic or hard
  link, no folder, FIFO or device, every `.npy` a plain integer array (read with allow_pickle=False).
- After, the indices it built or read are checked against the shard (check_indices), so a cache
  garbled or edited by hand is refused by name instead of training on other samples; indices read
  from the cache are also checked against the seed they are for (check_order): a valid permutation
  of another seed, or of none, would train on another order without a word.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Sequence

import numpy as np

from data_pipeline.shard_check import ShardReadError

BESIDE = "index-cache"  # the folder name older versions wrote beside the shards
LOCK = ".lock"  # data_pipeline.packed builds the indices holding it
_SAID: set[str] = set()


def index_cache_dir(prefixes: Sequence[str], cache_dir: str | None = None) -> str:
    """`cache_dir` (data.index_cache) when given; else a folder of this user's cache named after the
    first prefix's shards folder (the file names in it are keyed by the shards' content)."""
    if cache_dir:
        return cache_dir
    folder = os.path.dirname(os.path.abspath(prefixes[0]))
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    named = hashlib.sha256(folder.encode()).hexdigest()[:16]
    return os.path.join(user_cache, "implicit-megatron", "index-cache", named)


def received_caches(prefixes: Sequence[str], cache_dir: str) -> list[str]:
    """The `index-cache/` folders beside the prefixes' shards that are not `cache_dir`: never used."""
    found = []
    for prefix in prefixes:
        beside = os.path.join(os.path.dirname(os.path.abspath(prefix)), BESIDE)
        if os.path.lexists(beside) and os.path.abspath(cache_dir) != beside and beside not in found:
            found.append(beside)
    return found


def say_received_ignored(prefixes: Sequence[str], cache_dir: str) -> None:
    """One line per folder, from the first rank (or a process launched alone): the cache beside the
    shards is not what this run reads."""
    if os.environ.get("RANK", "0") != "0":
        return
    for beside in received_caches(prefixes, cache_dir):
        if beside not in _SAID:
            _SAID.add(beside)
            print(f"note: {beside}: not read (an index cache that came with the shards could hold anything); "
                  f"the packed-sample indices are built in {cache_dir}", file=sys.stderr)


def prepare_index_cache(cache_dir: str) -> None:
    """Make `cache_dir` (mode 0700) or check the folder there, before its lock file is made in it.
    Its entries are checked under that lock (check_entries): another process may be writing one."""
    if not os.path.lexists(cache_dir):
        try:
            os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        except OSError as err:
            raise ShardReadError(f"{cache_dir}: cannot make the packed-sample index cache ({err.strerror}); set "
                                 "data.index_cache to a folder of yours") from None
    _check_folder(cache_dir)
    for entry in os.scandir(cache_dir):  # the lock file is opened before the lock is held: checked first
        if entry.name == LOCK:
            _check_entry(entry, cache_dir)


def check_index_cache(cache_dir: str) -> None:
    """Refuse, by name, a cache folder others could write, and any entry megatron-core should not read."""
    _check_folder(cache_dir)
    check_entries(cache_dir)


def check_entries(cache_dir: str) -> None:
    """Every entry of the cache, as megatron-core would read it (under the cache's lock: no entry is
    half-written by another process then)."""
    for entry in os.scandir(cache_dir):
        _check_entry(entry, cache_dir)


def _check_folder(cache_dir: str) -> None:
    if os.path.islink(cache_dir):
        raise ShardReadError(f"{cache_dir}: the index cache is a symbolic link; remove it (it is rebuilt)")
    if not os.path.isdir(cache_dir):
        raise ShardReadError(f"{cache_dir}: the index cache is not a folder; remove it or set data.index_cache")
    info = os.stat(cache_dir)
    if info.st_uid != os.getuid():
        raise ShardReadError(f"{cache_dir}: the index cache is owned by user {info.st_uid}, not by this user "
                             f"({os.getuid()}); set data.index_cache to a folder of yours")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ShardReadError(f"{cache_dir}: the index cache is writable by other users (mode "
                             f"{stat.S_IMODE(info.st_mode):o}); chmod go-w it, or set data.index_cache to a "
                             "folder of yours")


def _check_entry(entry: os.DirEntry, cache_dir: str) -> None:
    again = f"remove {cache_dir} (it is rebuilt)"
    if entry.is_symlink():
        raise ShardReadError(f"{entry.path}: a symbolic link in the index cache; {again}")
    if not entry.is_file(follow_symlinks=False):  # megatron-core writes no folders; its lock is a file
        raise ShardReadError(f"{entry.path}: not a regular file (a folder, a FIFO or a device); {again}")
    if entry.stat(follow_symlinks=False).st_nlink > 1:
        raise ShardReadError(f"{entry.path}: a hard link (another name shares its content, and megatron-core "
                             f"would write through it); {again}")
    if entry.name.endswith(".npy"):
        _check_array(entry.path, again)


def _check_array(path: str, again: str) -> None:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - numpy's header parser raises many kinds (ValueError, TokenError, ...)
        raise ShardReadError(f"{path}: not a plain array ({err}); an index cache holds nothing else: "
                             f"{again}") from None
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.integer) or array.ndim not in (1, 2):
        raise ShardReadError(f"{path}: not a plain array of integers ({type(array).__name__}); an index cache holds "
                             f"nothing else: {again}")


def check_indices(dataset) -> None:
    """The indices megatron-core built, or read from its cache, follow from the shard: the document
    index holds every document equally often, consecutive sample starts lie `sequence_length` tokens
    apart in that stream, and the shuffle index is a permutation of the samples. One O(samples) pass
    (the Pile's 150 M samples: about a second), so a cache garbled or edited by hand is refused by
    name instead of training on other samples."""
    if dataset.shuffle_index is None:  # megatron-core's lazy load: read at the first sample
        return
    doc, samples, shuffle = (np.asarray(a) for a in (dataset.document_index, dataset.sample_index,
                                                      dataset.shuffle_index))
    lengths = np.asarray(dataset.dataset.sequence_lengths, dtype=np.int64)
    again = f"remove {dataset.config.path_to_cache} (it is rebuilt)"
    if doc.ndim != 1 or not len(doc) or doc.min() < 0 or doc.max() >= len(lengths) or \
            len(set(np.bincount(doc, minlength=len(lengths)).tolist())) != 1:
        raise ShardReadError(f"{_path(dataset, 'document')}: does not hold every document of {dataset.dataset_path} "
                             f"equally often (garbled or edited); {again}")
    if samples.ndim != 2 or samples.shape[1] != 2 or not len(samples) or samples[:, 0].min() < 0 or \
            samples[:, 0].max() >= len(doc) or samples[:, 1].min() < 0:
        raise ShardReadError(f"{_path(dataset, 'sample')}: sample boundaries outside the document stream (garbled "
                             f"or edited); {again}")
    starts = np.concatenate([[0], np.cumsum(lengths[doc])])
    offsets = samples[:, 1].astype(np.int64)
    positions = starts[samples[:, 0]] + offsets
    if positions[0] != 0 or np.any(np.diff(positions) != dataset.config.sequence_length) or \
            np.any(offsets > lengths[doc[samples[:, 0]]]):
        raise ShardReadError(f"{_path(dataset, 'sample')}: sample boundaries are not {dataset.config.sequence_length} "
                             f"tokens apart (garbled or edited); {again}")
    if shuffle.ndim != 1 or len(shuffle) != len(samples) - 1 or not _is_permutation(shuffle):
        raise ShardReadError(f"{_path(dataset, 'shuffle')}: not a permutation of its {len(samples) - 1} samples "
                             f"(garbled or edited); {again}")


def cached_before(dataset, began: float) -> bool:
    """Whether the dataset's shuffle index was read from a cache file written before `began`."""
    path = _path(dataset, "shuffle")
    return os.path.isfile(path) and os.stat(path).st_mtime < began


def _path(dataset, which: str) -> str:
    """The cached file megatron-core reads the index from (its naming: gpt_dataset.py)."""
    base = f"{dataset.unique_description_hash}-{type(dataset).__name__}-{dataset.index_split.name}"
    return os.path.join(dataset.config.path_to_cache, f"{base}-{which}_index.npy")


def _is_permutation(array: np.ndarray) -> bool:
    """Every index 0..n-1 once, in one pass (n bytes; the Pile's 150 M samples take well under a second)."""
    n = len(array)
    if n and (array.min() < 0 or array.max() >= n):
        return False
    seen = np.zeros(n, dtype=bool)
    seen[array] = True
    return bool(seen.all())


def check_order(dataset) -> None:
    """The document and shuffle indices read from a cache are the ones data.seed gives: drawn again
    with megatron-core's own functions from numpy.random.RandomState(seed), as it draws them (the
    document index once per epoch set, the final epoch apart where megatron-core kept it apart; the
    shuffle index next, from the same generator). Two permutations of the indices' length: a few
    seconds for the Pile, paid only where the cache is read."""
    from data_pipeline.indexed import import_megatron

    import_megatron()
    from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index

    doc, shuffle = np.asarray(dataset.document_index), np.asarray(dataset.shuffle_index)
    documents = np.asarray(dataset.indices)
    epochs = len(doc) // max(len(documents), 1)
    samples = len(np.asarray(dataset.sample_index)) - 1
    again = f"remove {dataset.config.path_to_cache} (it is rebuilt)"
    for separate in ((False, True) if epochs > 1 else (False,)):  # megatron-core's choice, found by which matches
        state = np.random.RandomState(dataset.config.random_seed)
        if np.array_equal(_build_document_index(documents, epochs, state, separate), doc):
            break
    else:
        raise ShardReadError(f"{_path(dataset, 'document')}: not the document order of seed "
                             f"{dataset.config.random_seed} (data.seed; another seed's, or edited); {again}")
    first = samples
    if separate:  # the samples of the epochs before the final one are shuffled apart from it
        first = ((epochs - 1) * dataset._get_num_tokens_per_epoch() - dataset.config.add_extra_token_to_sequence) \
            // dataset.config.sequence_length
    if not np.array_equal(_build_shuffle_index(first, samples, state), shuffle):
        raise ShardReadError(f"{_path(dataset, 'shuffle')}: not the sample order of seed {dataset.config.random_seed} "
                             f"(data.seed; another seed's, or edited); {again}")
