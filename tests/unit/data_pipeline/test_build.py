"""The quickstart path: the bundled corpus is tokenized once, then read at training and eval lengths."""

from __future__ import annotations

import json
import os

import pytest

from data_pipeline.build import ensure_shards
from data_pipeline.packed import DistributedBatchIterator, build_eval_datasets, build_packed_dataset


@pytest.mark.processes
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


def files_and_stamps(folder) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_changed_source_is_refused_and_nothing_is_touched(tmp_path, neox_path, write_jsonl):
    """Shards built from data.source are never rebuilt behind the user's back: a changed source, or
    another file, is refused naming both and the key to change, with every file left as it was."""
    from data_pipeline.build import SourceMismatch

    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"to be or not to be, {i}"} for i in range(20)])
    prefix = str(tmp_path / "cache" / "neox")
    ensure_shards(str(source), prefix, neox_path, 0.0, 0.0, workers=0, progress=False)
    record = json.loads((tmp_path / "cache" / "neox_source.json").read_text())
    assert record["path"] == str(source) and record["size"] == source.stat().st_size
    before = files_and_stamps(tmp_path / "cache")
    ensure_shards(str(source), prefix, neox_path, 0.0, 0.0, workers=0, progress=False)  # the same source: kept
    write_jsonl(source, [{"text": f"that is the question, {i}"} for i in range(30)])
    other = write_jsonl(tmp_path / "other.jsonl", [{"text": "words"}] * 5)
    for changed, named in ((source, f"{source} as it was then"), (other, f"{source} (")):
        with pytest.raises(SourceMismatch) as info:
            ensure_shards(str(changed), prefix, neox_path, 0.0, 0.0, workers=0, progress=False)
        assert f"{prefix}_* were built from {named}" in str(info.value)
        assert f"data.source is {changed}" in str(info.value) and "Nothing was changed" in str(info.value)
        assert files_and_stamps(tmp_path / "cache") == before


def test_shards_the_trainer_did_not_build_are_never_claimed_or_rebuilt(tmp_path, neox_path, write_jsonl, capsys):
    """Shards made by preprocess from three files, under data/cache/, with a config whose base names
    another data.source: kept as they are, no record claims them, the source is not read."""
    from data_pipeline.pipeline import PreprocessConfig, run_preprocess

    parts = [write_jsonl(tmp_path / f"part{k}.jsonl", [{"text": f"part {k}, line {i}"} for i in range(10)])
             for k in range(3)]
    prefix = str(tmp_path / "cache" / "mine")
    run_preprocess(PreprocessConfig(inputs=[str(p) for p in parts], tokenizer=neox_path, output_prefix=prefix,
                                    workers=0, append_eod=True, progress=False))
    before = files_and_stamps(tmp_path / "cache")
    assert json.loads((tmp_path / "cache" / "mine_stats.json").read_text())["documents"] == 30
    for source in (parts[0], tmp_path / "shakespeare.jsonl"):  # another file; one that is not there
        ensure_shards(str(source), prefix, neox_path, 0.05, 0.05, workers=0, progress=False)
        assert "were not built from data.source" in capsys.readouterr().out
        assert files_and_stamps(tmp_path / "cache") == before  # no mine_source.json, nothing rebuilt
