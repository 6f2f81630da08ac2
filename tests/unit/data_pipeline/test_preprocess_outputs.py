"""Shards written by preprocessing, read back with megatron-core, against direct tokenization."""

from __future__ import annotations

import json

import pytest

from data_pipeline.indexed import document_lengths, find_shards
from data_pipeline.pipeline import PreprocessConfig, PreprocessError, run_preprocess
from data_pipeline.splits import SPLITS


def _config(inputs, prefix, tokenizer, **overrides) -> PreprocessConfig:
    settings = {"append_eod": True, "valid_fraction": 0.2, "test_fraction": 0.2, "workers": 0,
                "progress": False, "batch_bytes": 2048}
    settings.update(overrides)
    return PreprocessConfig(inputs=[str(p) for p in inputs], tokenizer=tokenizer, output_prefix=str(prefix),
                            **settings)


@pytest.mark.processes
def test_shards_equal_direct_tokenization(tmp_path, neox, neox_path, small_texts, write_jsonl, read_split,
                                          expected_split_docs):
    first = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in small_texts[:35]])
    second = write_jsonl(tmp_path / "b.jsonl", [{"text": t, "id": i} for i, t in enumerate(small_texts[35:])])
    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(_config([first, second], prefix, neox_path, workers=2))

    expected = expected_split_docs(neox, small_texts, 0.2, 0.2)
    for split in SPLITS:
        assert read_split(str(prefix), split) == expected[split], split
    assert all(expected[split] for split in SPLITS), "the fractions should give every split documents"
    assert stats["documents"] == len(small_texts)
    assert stats["tokens"] == sum(len(d) for docs in expected.values() for d in docs)
    assert stats["bytes"] == sum(len(t.encode()) for t in small_texts)
    assert stats["dtype"] == "uint16" and stats["eod_id"] == neox.eod_id == 0
    assert stats["skipped"] == {}
    assert json.loads((tmp_path / "out" / "neox_stats.json").read_text())["tokens"] == stats["tokens"]
    assert not (tmp_path / "out" / "neox.work").exists()


@pytest.mark.processes
def test_split_assignment_is_independent_of_worker_count(tmp_path, neox_path, small_texts, write_jsonl,
                                                         output_bytes):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in small_texts])
    outputs = {}
    for workers in (1, 2):
        prefix = tmp_path / f"w{workers}" / "neox"
        stats = run_preprocess(_config([source], prefix, neox_path, workers=workers))
        outputs[workers] = (output_bytes(str(prefix)), {s: stats["splits"][s]["documents"] for s in SPLITS})
    assert outputs[1] == outputs[2]  # same documents in the same splits, byte for byte
    assert len(outputs[1][0]) == 6


def test_max_shard_tokens_cuts_at_documents(tmp_path, neox, neox_path, small_texts, write_jsonl, read_split):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in small_texts])
    whole = tmp_path / "whole" / "neox"
    run_preprocess(_config([source], whole, neox_path))
    cap = 1000
    sharded = tmp_path / "sharded" / "neox"
    stats = run_preprocess(_config([source], sharded, neox_path, max_shard_tokens=cap))

    shards = find_shards(str(sharded), "train")
    assert len(shards) > 2 and shards[0].endswith("neox_train_00000")
    assert stats["splits"]["train"]["shards"] == [str(s) for s in shards]
    for split in SPLITS:
        assert read_split(str(sharded), split) == read_split(str(whole), split)
    for shard in shards:
        lengths = document_lengths(shard)
        assert lengths.sum() <= cap or len(lengths) == 1


@pytest.mark.timeout(60)  # the merge once looped back over a document longer than the cap, filling the disk
def test_a_document_longer_than_the_shard_cap_gets_a_shard_of_its_own(tmp_path, neox, neox_path, write_jsonl,
                                                                        read_split, capsys):
    long = " ".join(["word"] * 200)
    texts = ["ROMEO: short.", long, "JULIET: short too.", long + " again", "HAMLET: the end.", "one", long]
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(_config([source], prefix, neox_path, valid_fraction=0.0, test_fraction=0.0,
                                   max_shard_tokens=50))
    documents = [neox.encode(t) + [neox.eod_id] for t in texts]
    assert read_split(str(prefix), "train") == documents  # every document once, in order, uncut
    shards = find_shards(str(prefix), "train")
    sizes = [document_lengths(shard) for shard in shards]
    assert all(lengths.sum() <= 50 or len(lengths) == 1 for lengths in sizes)
    assert [len(lengths) for lengths in sizes if lengths.sum() > 50] == [1, 1, 1]  # the long ones, alone
    assert len(shards) <= len(texts) and stats["splits"]["train"]["shards"] == [str(s) for s in shards]
    longest = max(int(lengths.sum()) for lengths in sizes)
    assert (f"note: 3 document(s) longer than --max-shard-tokens 50 (the longest {longest:,} tokens) got a shard of "
            "their own, over the cap: documents are never cut") in capsys.readouterr().err


def test_limit_docs_keeps_the_first_documents(tmp_path, neox, neox_path, small_texts, write_jsonl, read_split,
                                              expected_split_docs):
    first = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in small_texts[:10]] + [{"text": ""}])
    second = write_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in small_texts[10:]])
    third = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in small_texts])
    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(_config([first, second, third], prefix, neox_path, limit_docs=25))
    expected = expected_split_docs(neox, small_texts[:25], 0.2, 0.2)
    for split in SPLITS:
        assert read_split(str(prefix), split) == expected[split]
    assert stats["documents"] == 25 and stats["skipped"] == {"empty_text": 1}
    assert stats["inputs_processed"] == 2


def test_finished_output_is_kept(tmp_path, neox_path, small_texts, write_jsonl, output_bytes):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in small_texts[:20]])
    prefix = tmp_path / "out" / "neox"
    first = run_preprocess(_config([source], prefix, neox_path))
    before = output_bytes(str(prefix))
    assert run_preprocess(_config([source], prefix, neox_path)) == first  # same arguments: nothing to do
    with pytest.raises(PreprocessError, match="other inputs or settings"):
        run_preprocess(_config([source], prefix, neox_path, test_fraction=0.5))
    assert output_bytes(str(prefix)) == before


def test_eod_token_option_overrides_the_end_of_text_token(tmp_path, neox, neox_path, small_texts, write_jsonl,
                                                          read_split):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in small_texts[:5]])
    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(_config([source], prefix, neox_path, eod_token="<|padding|>", valid_fraction=0.0,
                                   test_fraction=0.0))
    padding = neox.token_id("<|padding|>")
    assert stats["eod_id"] == padding != neox.eod_id
    assert read_split(str(prefix), "train") == [neox.encode(t) + [padding] for t in small_texts[:5]]


@pytest.mark.processes
def test_throughput_is_wall_clock(tmp_path, neox_path, small_texts, write_jsonl, monkeypatch):
    """The rates are over the run's wall time, read from the clock at its start and end (a clock of
    the test's here: the run takes exactly 100 s of it), not over the workers' CPU time."""
    from data_pipeline import pipeline

    first = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in small_texts[:30]])
    second = write_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in small_texts[30:]])
    prefix = tmp_path / "out" / "neox"
    readings = iter([1000.0, 1100.0])
    monkeypatch.setattr(pipeline, "time", type("Clock", (), {"monotonic": staticmethod(lambda: next(readings))}))
    stats = run_preprocess(_config([first, second], prefix, neox_path, workers=1))

    assert stats["wall_seconds"] == 100.0
    assert stats["tokens_per_second"] == pytest.approx(stats["tokens"] / 100.0)
    assert stats["docs_per_second"] == pytest.approx(stats["documents"] / stats["wall_seconds"])
    # a worker's own encode rate is named apart: its CPU time is only part of the wall time
    assert stats["tokens_per_worker_cpu_second"] == pytest.approx(stats["tokens"] / stats["encode_cpu_seconds"])
    assert stats["tokens_per_worker_cpu_second"] > stats["tokens_per_second"]

