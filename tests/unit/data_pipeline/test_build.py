"""The quickstart path: the bundled corpus is tokenized once, then read at training and eval lengths."""

from __future__ import annotations

import os

import pytest

from data_pipeline.build import ensure_shards
from data_pipeline.packed import DistributedBatchIterator, build_eval_datasets, build_packed_dataset


def test_ensure_shards_builds_once_then_serves_training_and_eval(tmp_path, neox, neox_path, corpus_path, corpus,
                                                                 read_split):
    prefix = str(tmp_path / "shakespeare" / "neox")
    ensure_shards(corpus_path, prefix, neox_path, 0.05, 0.05, progress=False)
    files = sorted(os.listdir(tmp_path / "shakespeare"))
    assert [f for f in files if f.endswith((".bin", ".idx", ".json"))] == [
        "neox_source.json", "neox_stats.json", "neox_test.bin", "neox_test.idx", "neox_train.bin", "neox_train.idx",
        "neox_valid.bin", "neox_valid.idx"]
    stamps = {f: os.stat(tmp_path / "shakespeare" / f).st_mtime_ns for f in files}
    ensure_shards(corpus_path, prefix, neox_path, 0.05, 0.05, progress=False)  # a no-op
    assert {f: os.stat(tmp_path / "shakespeare" / f).st_mtime_ns for f in files} == stamps

    documents = {split: read_split(prefix, split) for split in ("train", "valid", "test")}
    assert sum(len(d) for d in documents.values()) == len(corpus) == 801
    assert all(len(documents[s]) >= 20 for s in ("valid", "test"))  # 5 % each: small splits are non-empty

    train = build_packed_dataset([prefix], None, "train", 128, seed=1234, num_samples=64)
    batch = next(DistributedBatchIterator(train, 4, 0, 2, 8))
    assert batch.shape == (4, 129)
    assert any(word in neox.decode(batch.flatten().tolist()) for word in (" the ", " and ", " of "))
    evals = build_eval_datasets([prefix], "test", (4096, 8192, 16384), seed=1234)
    test_tokens = sum(len(d) for d in documents["test"])
    for length, dataset in evals.items():
        assert len(dataset) == (test_tokens - 1) // length > 0
        assert dataset[0].shape == (length + 1,) and dataset[0].dtype.name == "int64"


def test_ensure_shards_refuses_shards_of_another_tokenizer(tmp_path, corpus_path, neox_path, write_jsonl):
    from data_pipeline.train_tokenizer import iter_texts, train_byte_bpe

    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": "to be or not to be"}] * 20)
    prefix = str(tmp_path / "tiny" / "neox")
    ensure_shards(str(source), prefix, neox_path, 0.0, 0.0, workers=0, progress=False)
    other = train_byte_bpe(iter_texts([corpus_path], limit_docs=20), 400, str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match="another tokenizer"):
        ensure_shards(str(source), prefix, other, 0.0, 0.0, progress=False)


def test_a_changed_source_is_built_again(tmp_path, neox_path, write_jsonl, capsys):
    """Shards built from data.source follow the source: the same file is never tokenized twice, a
    changed one is (its documents, not the first build's, are what the shards then hold)."""
    import json

    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"to be or not to be, {i}"} for i in range(20)])
    prefix = str(tmp_path / "cache" / "neox")
    ensure_shards(str(source), prefix, neox_path, 0.0, 0.0, workers=0, progress=False)
    stats = tmp_path / "cache" / "neox_stats.json"
    assert json.loads(stats.read_text())["documents"] == 20
    built = stats.stat().st_mtime_ns
    ensure_shards(str(source), prefix, neox_path, 0.0, 0.0, workers=0, progress=False)
    assert stats.stat().st_mtime_ns == built  # the same source: kept
    write_jsonl(source, [{"text": f"that is the question, {i}"} for i in range(30)])
    capsys.readouterr()
    ensure_shards(str(source), prefix, neox_path, 0.0, 0.0, workers=0, progress=False)
    assert f"{source} changed since {prefix}_* were built from it" in capsys.readouterr().out
    assert json.loads(stats.read_text())["documents"] == 30
    record = json.loads((tmp_path / "cache" / "neox_source.json").read_text())
    assert record["size"] == source.stat().st_size
