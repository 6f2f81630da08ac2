"""Packed samples: exact one-epoch coverage across data-parallel ranks, resumption, blending."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.indexed import megatron_indexed
from data_pipeline.packed import DistributedBatchIterator, ShardReadError, build_packed_dataset

SEQ = 16


def write_unique_token_shard(prefix: str, lengths: list[int], start: int = 0) -> list[range]:
    """A shard whose every token is distinct (token = its position + start): samples can be traced."""
    _, builder_cls = megatron_indexed()
    builder = builder_cls(prefix + ".bin", dtype=np.uint16)
    documents = []
    for length in lengths:
        document = range(start, start + length)
        builder.add_document(np.array(document), [length])
        documents.append(document)
        start += length
    builder.finalize(prefix + ".idx")
    return documents


def document_lengths_summing_to(total: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(int(rng.integers(1, 60)))
    lengths[-1] -= sum(lengths) - total
    return [n for n in lengths if n > 0]


class RecordingSamples:
    """A dataset that remembers which samples were read."""

    def __init__(self, dataset) -> None:
        self.dataset, self.read = dataset, []

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> np.ndarray:
        self.read.append(index)
        return self.dataset[index]


def test_one_epoch_across_ranks_covers_every_token_once(tmp_path):
    """Cover, precisely: with n = (T - 1) // SEQ samples per epoch, the samples' inputs (first SEQ
    tokens) are n * SEQ distinct tokens; chained by their one-token overlap (a sample's last token
    is the next one's first) they form one stream of n * SEQ + 1 tokens made of whole documents in
    some order, then the head of one more; the tokens left out are exactly the epoch's last
    T - n * SEQ - 1 tokens, which Megatron drops."""
    tail = 7
    total = 64 * SEQ + 1 + tail
    documents = write_unique_token_shard(str(tmp_path / "toy_train"), document_lengths_summing_to(total))
    dataset = build_packed_dataset([str(tmp_path / "toy")], None, "train", SEQ, seed=5)
    assert len(dataset) == (total - 1) // SEQ == 64

    micro, dp, accum = 2, 2, 2
    samples = []
    for rank in range(dp):
        samples.extend(b.numpy() for batch in DistributedBatchIterator(dataset, micro, rank, dp, accum)
                       for b in batch)
    assert len(samples) == len(dataset)
    inputs = np.concatenate([s[:SEQ] for s in samples])
    assert len(set(inputs.tolist())) == len(inputs) == 64 * SEQ

    by_first = {int(s[0]): s for s in samples}
    lasts = {int(s[-1]) for s in samples}
    (head,) = [s for s in samples if int(s[0]) not in lasts]  # the epoch's first sample
    stream = list(head)
    while stream[-1] in by_first:
        stream.extend(by_first[stream[-1]][1:].tolist())
    assert len(stream) == 64 * SEQ + 1  # one chain through every sample

    start_of = {d.start: d for d in documents}
    position, order = 0, []
    while position < len(stream):
        document = start_of[stream[position]]  # every piece starts a document...
        piece = stream[position:position + len(document)]
        assert piece == list(document)[:len(piece)]  # ...and runs through it in order
        order.append(document)
        position += len(piece)
    assert len(set(order)) == len(order)
    left_out = set(range(total)) - set(stream)
    partial = order[-1]
    expected_left = set(partial[len(stream) - sum(len(d) for d in order[:-1]):])
    expected_left |= {t for d in documents if d not in order for t in d}
    assert left_out == expected_left and len(left_out) == tail


def test_each_rank_reads_only_its_slice_of_every_global_batch(tmp_path):
    write_unique_token_shard(str(tmp_path / "toy_train"), document_lengths_summing_to(3000))
    dataset = build_packed_dataset([str(tmp_path / "toy")], None, "train", SEQ, seed=1)
    micro, dp, accum = 3, 4, 2
    global_batch = micro * dp * accum
    readers = [RecordingSamples(dataset) for _ in range(dp)]
    batches = [list(DistributedBatchIterator(readers[r], micro, r, dp, accum)) for r in range(dp)]
    steps = len(dataset) // global_batch
    for rank in range(dp):
        expected = [g * global_batch + k * micro * dp + rank * micro + i
                    for g in range(steps) for k in range(accum) for i in range(micro)]
        assert readers[rank].read == expected
        assert len(batches[rank]) == steps * accum and batches[rank][0].shape == (micro, SEQ + 1)
    everything = sorted(i for reader in readers for i in reader.read)
    assert everything == list(range(steps * global_batch))  # disjoint, and together complete


def test_resuming_at_consumed_samples_continues_the_sequence(tmp_path):
    write_unique_token_shard(str(tmp_path / "toy_train"), document_lengths_summing_to(4000))
    dataset = build_packed_dataset([str(tmp_path / "toy")], None, "train", SEQ, seed=3, num_samples=600)
    uninterrupted = list(DistributedBatchIterator(dataset, 2, 1, 2, 3))

    first = DistributedBatchIterator(dataset, 2, 1, 2, 3)
    before = [next(first) for _ in range(7)]  # stop in the middle of a global batch
    state = first.state_dict()
    assert state["consumed_samples"] == 7 * 2 * 2
    rebuilt = build_packed_dataset([str(tmp_path / "toy")], None, "train", SEQ, seed=3, num_samples=600)
    resumed = DistributedBatchIterator(rebuilt, 2, 1, 2, 3)
    resumed.load_state_dict(state)
    after = list(resumed)
    assert len(before) + len(after) == len(uninterrupted)
    for a, b in zip(before + after, uninterrupted):
        assert np.array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="multiple of"):
        DistributedBatchIterator(dataset, 2, 0, 2, 3, consumed_samples=3)


def test_several_epochs_are_deterministic_and_seeded(tmp_path):
    documents = write_unique_token_shard(str(tmp_path / "toy_train"), document_lengths_summing_to(1200))
    one_epoch = (1200 - 1) // SEQ
    dataset = build_packed_dataset([str(tmp_path / "toy")], None, "train", SEQ, seed=7, num_samples=3 * one_epoch)
    again = build_packed_dataset([str(tmp_path / "toy")], None, "train", SEQ, seed=7, num_samples=3 * one_epoch)
    other = build_packed_dataset([str(tmp_path / "toy")], None, "train", SEQ, seed=8, num_samples=3 * one_epoch)
    assert len(dataset) == 3 * one_epoch
    samples = [dataset[i] for i in range(len(dataset))]
    assert all(np.array_equal(s, again[i]) for i, s in enumerate(samples))
    assert not all(np.array_equal(s, other[i]) for i, s in enumerate(samples))
    seen = Counter(np.concatenate([s[:SEQ] for s in samples]).tolist())
    assert set(seen) <= {t for d in documents for t in d} and max(seen.values()) <= 3
    assert sum(seen.values()) == 3 * one_epoch * SEQ


def test_weighted_blend_of_sharded_prefixes(tmp_path):
    for k in range(3):  # prefix a: three shards; tokens 0..2999
        write_unique_token_shard(str(tmp_path / f"a_train_{k:05d}"), document_lengths_summing_to(1000, k), 1000 * k)
    write_unique_token_shard(str(tmp_path / "b_train"), document_lengths_summing_to(1000, 9), 10000)
    dataset = build_packed_dataset([str(tmp_path / "a"), str(tmp_path / "b")], [0.25, 0.75], "train", SEQ,
                                   seed=2, num_samples=400)
    assert len(dataset) == 400
    from_b = sum(int(dataset[i][0]) >= 10000 for i in range(len(dataset)))
    assert abs(from_b - 300) <= 3  # megatron-core's blending follows the weights closely
    shards_used = {int(dataset[i][0]) // 1000 for i in range(len(dataset)) if dataset[i][0] < 10000}
    assert shards_used == {0, 1, 2}

    unweighted = build_packed_dataset([str(tmp_path / "a"), str(tmp_path / "b")], None, "train", SEQ, seed=2)
    assert len(unweighted) == 3 * (999 // SEQ) + 999 // SEQ  # one epoch of every shard
    firsts = [int(unweighted[i][0]) for i in range(len(unweighted))]
    assert len(set(firsts)) == len(firsts)


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no valid shards"):
        build_packed_dataset([str(tmp_path / "missing")], None, "valid", SEQ, seed=1)
    write_unique_token_shard(str(tmp_path / "tiny_test"), [5, 5])
    with pytest.raises(ValueError, match="fewer than one sample"):
        build_packed_dataset([str(tmp_path / "tiny")], None, "test", SEQ, seed=1)


def test_an_index_swapped_for_one_of_the_same_size_is_not_read_with_stale_indices(tmp_path):
    """The packed-index cache was keyed by the .bin alone: an .idx replaced by one of the same size
    (other document boundaries, same token count) reused indices into documents it no longer has."""
    prefix, other = str(tmp_path / "a_train"), str(tmp_path / "b" / "b_train")
    (tmp_path / "b").mkdir()
    lengths = document_lengths_summing_to(1000, seed=0)
    write_unique_token_shard(prefix, lengths)
    write_unique_token_shard(other, sorted(lengths, reverse=True))  # same count and total, other boundaries
    before = build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    [before[i] for i in range(len(before))]  # the cache now holds this shard's indices
    (tmp_path / "a_train.idx").write_bytes((tmp_path / "b" / "b_train.idx").read_bytes())
    after = build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    samples = [after[i] for i in range(len(after))]
    assert all(len(sample) == SEQ + 1 for sample in samples)


def test_an_index_edited_inside_with_its_size_and_time_kept_is_not_read_with_stale_indices(tmp_path):
    """Boundaries moved in the middle of a large .idx (beyond any prefix or suffix a partial digest
    reads), its size and modification time put back: the cached indices are not reused."""
    import os

    import numpy as np

    prefix = str(tmp_path / "a_train")
    lengths = [3, 5] * 20000  # 40,000 documents: an index of 800 KB
    write_unique_token_shard(prefix, lengths)
    before = build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    [before[i] for i in range(len(before))]
    idx = tmp_path / "a_train.idx"
    stat, data = idx.stat(), bytearray(idx.read_bytes())
    header = len(data) - 20 * len(lengths) - 8  # then lengths (int32), pointers and document index (int64)
    sizes = np.frombuffer(bytes(data[header:header + 4 * len(lengths)]), dtype=np.int32).copy()
    sizes[20000], sizes[20001] = sizes[20001], sizes[20000]  # two documents in the middle: 3, 5 -> 5, 3
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64)]) * 2  # uint16 tokens
    data[header:header + 4 * len(lengths)] = sizes.tobytes()
    data[header + 4 * len(lengths):header + 12 * len(lengths)] = pointers.tobytes()
    idx.write_bytes(bytes(data))
    os.utime(idx, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert idx.stat().st_size == stat.st_size and idx.stat().st_mtime_ns == stat.st_mtime_ns
    after = build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    fresh = build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1,
                                 cache_dir=str(tmp_path / "fresh-cache"))
    assert len(after) == len(fresh)
    assert all(np.array_equal(after[i], fresh[i]) for i in range(len(fresh)))


def test_a_failed_read_names_the_shard(tmp_path, monkeypatch):
    """Indices that no longer fit their shard (here: a cache keyed as before, by the .bin alone,
    after the .idx was swapped) fail with the shard's prefix, not a bare numpy error."""
    from data_pipeline import packed

    monkeypatch.setattr(packed, "_content_digest", lambda path: "")
    monkeypatch.setattr(packed, "_stat", lambda path: [0, 0])
    prefix = str(tmp_path / "a_train")
    lengths = document_lengths_summing_to(1000, seed=0)
    write_unique_token_shard(prefix, lengths)
    (tmp_path / "b").mkdir()
    write_unique_token_shard(str(tmp_path / "b" / "b_train"), sorted(lengths, reverse=True))
    build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    (tmp_path / "a_train.idx").write_bytes((tmp_path / "b" / "b_train.idx").read_bytes())
    with pytest.raises(ShardReadError, match=r"-sample_index\.npy: sample boundaries are not 16 tokens apart"):
        build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)  # the indices checked at open
    monkeypatch.setattr(packed, "check_indices", lambda dataset: None)
    stale = build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    with pytest.raises(ValueError, match=f"^{prefix}: reading sample [0-9]+ failed"):
        [stale[i] for i in range(len(stale))]


def test_the_index_cache_is_this_users_wherever_the_shards_are(tmp_path, monkeypatch):
    """Shards still to be built (data.source), in a folder this user writes or in one it cannot: the
    cache is in the user's cache, made for this user alone; data.index_cache names another place."""
    from data_pipeline.packed import index_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    (tmp_path / "locked").mkdir(mode=0o500)
    for prefix in (tmp_path / "cache" / "shakespeare" / "neox", tmp_path / "locked" / "new" / "neox"):
        assert index_cache_dir([str(prefix)]).startswith(str(tmp_path / "user-cache" / "implicit-megatron"))
    assert index_cache_dir([str(tmp_path / "a")], str(tmp_path / "mine")) == str(tmp_path / "mine")
    write_unique_token_shard(str(tmp_path / "a_train"), document_lengths_summing_to(200))
    build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    made = index_cache_dir([str(tmp_path / "a")])
    assert os.stat(made).st_mode & 0o777 == 0o700 and list(Path(made).glob("*.npy"))
    assert not (tmp_path / "index-cache").exists()


def test_a_token_id_past_the_vocabulary_is_refused_naming_the_shards_and_the_sample():
    """Random bytes written into a shard under a running job: the batch that reads them is refused by
    name, not served to an embedding whose IndexError names nothing."""
    samples = [np.full(9, 5, dtype=np.uint16) for _ in range(8)]
    samples[5][3] = 60_000
    batches = DistributedBatchIterator(samples, 2, 0, 1, 1, vocab_size=50_277, source="data.prefixes [/d/neox]")
    assert next(batches).shape == (2, 9) and next(batches).shape == (2, 9)
    with pytest.raises(ValueError, match=r"^data.prefixes \[/d/neox\]: sample 5 holds token id 60000, past the "
                                         r"vocabulary of 50277: the shards changed under the run"):
        next(batches)


def test_a_shard_cut_under_a_running_job_is_named_before_it_is_read(tmp_path):
    """Read through its memory map, a .bin cut after it was opened would end the process with SIGBUS
    and no line; each read compares the file sizes with those opened first."""
    prefix = str(tmp_path / "a_train")
    write_unique_token_shard(prefix, document_lengths_summing_to(1000))
    data = build_packed_dataset([str(tmp_path / "a")], None, "train", SEQ, seed=1)
    last = len(data) - 1
    assert len(data[last]) == SEQ + 1
    whole = os.path.getsize(prefix + ".bin")
    os.truncate(prefix + ".bin", 100)
    with pytest.raises(ShardReadError, match=f"^{prefix}: its .bin/.idx were \\({whole}, [0-9]+\\) bytes when this "
                                             "process opened them and are \\(100, [0-9]+\\) now: the shard changed"):
        data[last]
