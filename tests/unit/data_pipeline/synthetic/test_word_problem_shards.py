"""Word-problem shards: the files, the manifest, memory-mapped reading and determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_pipeline.synthetic.word_problem import WordProblemSpec, generate_words, prefix_products
from data_pipeline.synthetic.word_problem_shards import WordProblemShards, shard_paths, shard_rng, write_shards


def test_write_and_read_back(tmp_path):
    spec = WordProblemSpec("Ma_A5", length=20, p=0.1, seed=4)
    prefix = tmp_path / "sets" / "Ma_A5_L20_train"
    manifest_path = write_shards(spec, num_sequences=10, prefix=prefix, sequences_per_shard=4)
    manifest = json.loads(manifest_path.read_text())
    assert manifest_path == tmp_path / "sets" / "Ma_A5_L20_train.json"
    assert [s["num_sequences"] for s in manifest["shards"]] == [4, 4, 2]
    assert manifest["vocab_size"] == 240 and manifest["dtype"] == "int16"
    assert manifest["spec"] == {"group": "Ma_A5", "length": 20, "p": 0.1, "seed": 4}

    inputs_path, labels_path = shard_paths(prefix, 1)
    assert inputs_path.name == "Ma_A5_L20_train_00001_inputs.npy" and labels_path.is_file()
    raw = np.load(inputs_path, mmap_mode="r")  # what a training loader does
    assert raw.shape == (4, 20) and raw.dtype == np.int16

    data = WordProblemShards(prefix)
    assert len(data) == 10 and data.spec == spec
    assert isinstance(data.inputs[0], np.memmap)
    expected = [generate_words(spec, n, shard_rng(spec.seed, k)) for k, n in enumerate((4, 4, 2))]
    all_inputs = np.concatenate([e[0] for e in expected])
    for i in range(10):
        x, y = data[i]
        assert np.array_equal(x, all_inputs[i])
        assert np.array_equal(y, prefix_products(x, spec.algebra.table))
    assert np.array_equal(data[-1][0], all_inputs[-1])
    with pytest.raises(IndexError):
        data[10]


def test_same_spec_same_files_and_rewrite(tmp_path):
    spec = WordProblemSpec("S5", length=16, p=None, seed=1)
    write_shards(spec, 6, tmp_path / "a", sequences_per_shard=3)
    write_shards(spec, 6, tmp_path / "b", sequences_per_shard=3)
    for k in range(2):
        assert shard_paths(tmp_path / "a", k)[0].read_bytes() == shard_paths(tmp_path / "b", k)[0].read_bytes()
    write_shards(spec, 6, tmp_path / "a", sequences_per_shard=3)  # rewriting in place works
    assert len(WordProblemShards(tmp_path / "a")) == 6
    assert not list(tmp_path.glob("*.tmp"))


def test_missing_or_foreign_manifest(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest"):
        WordProblemShards(tmp_path / "nothing")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="word-problem-npy"):
        WordProblemShards(tmp_path / "other")
