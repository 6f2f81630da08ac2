"""Every input format reads to the same documents: parquet, jsonl.zst, json.gz, save_to_disk."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.splits import SPLITS


@pytest.mark.processes
def test_all_formats_read(tmp_path, neox, neox_path, small_texts, read_split, expected_split_docs):
    import datasets

    texts = small_texts[:24]
    chunks = [texts[0:6], texts[6:12], texts[12:18], texts[18:24]]
    lines = ["".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(c)).encode() for c in chunks]

    parquet = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": list(range(6)), "text": chunks[0]}), parquet, row_group_size=4)
    zst = tmp_path / "b.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(lines[1]))
    gz = tmp_path / "c.json.gz"
    gz.write_bytes(gzip.compress(lines[2]))
    disk = tmp_path / "d_saved"
    datasets.Dataset.from_dict({"text": chunks[3], "meta": ["x"] * 6}).save_to_disk(str(disk))

    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(PreprocessConfig(
        inputs=[str(parquet), str(zst), str(gz), str(disk)], tokenizer=neox_path, output_prefix=str(prefix),
        append_eod=True, valid_fraction=0.25, test_fraction=0.25, workers=1, progress=False, batch_docs=4))

    assert stats["documents"] == 24 and stats["skipped"] == {}
    expected = expected_split_docs(neox, texts, 0.25, 0.25)
    for split in SPLITS:
        assert read_split(str(prefix), split) == expected[split]


def test_columnar_inputs_skip_bad_values(tmp_path, neox, neox_path, small_texts, read_split, expected_split_docs):
    import datasets

    good = small_texts[:3]
    binary = tmp_path / "binary.parquet"  # a binary text column: undecodable bytes are invalid_utf8
    pq.write_table(pa.table({"text": pa.array([good[0].encode(), b"\xff\xfe", None, b""], pa.binary())}), binary)
    no_column = tmp_path / "no_column.parquet"
    pq.write_table(pa.table({"body": ["x", "y"]}), no_column)
    dict_dir = tmp_path / "dict_saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": [good[1], "  "]}),
                          "test": datasets.Dataset.from_dict({"text": [good[2]]})}).save_to_disk(str(dict_dir))

    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(PreprocessConfig(
        inputs=[str(binary), str(no_column), str(dict_dir)], tokenizer=neox_path, output_prefix=str(prefix),
        append_eod=True, valid_fraction=0.3, test_fraction=0.3, workers=0, progress=False))

    assert stats["skipped"] == {"invalid_utf8": 1, "missing_text": 3, "empty_text": 2}
    assert stats["skipped_examples"]["invalid_utf8"] == [f"{binary}:row 1"]
    assert stats["skipped_examples"]["missing_text"] == [f"{binary}:row 2", f"{no_column}:row 0",
                                                          f"{no_column}:row 1"]
    assert stats["skipped_examples"]["empty_text"] == [f"{binary}:row 3", f"{dict_dir}[train]:row 1"]
    expected = expected_split_docs(neox, [good[0]], 0.3, 0.3)  # a DatasetDict's records keep their split:
    expected["test"] += expected_split_docs(neox, [good[2]], 0, 0)["train"]  # its splits in sorted order
    expected["train"] += expected_split_docs(neox, [good[1]], 0, 0)["train"]
    for split in SPLITS:
        assert read_split(str(prefix), split) == expected[split]


def test_a_dataset_dicts_splits_are_used_as_they_are(tmp_path, neox_path, small_texts, read_split, capsys):
    """train 150 + validation 40 give the shards' train and valid splits, not 190 documents split again
    by hash; a split that is none of ours is refused before any work, naming the folder to give."""
    import datasets
    import pytest

    from data_pipeline.plan import PreprocessError

    texts = [f"{small_texts[i % len(small_texts)]} ({i})" for i in range(190)]
    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[:150]}),
                          "validation": datasets.Dataset.from_dict({"text": texts[150:]})}).save_to_disk(str(folder))
    prefix = tmp_path / "out" / "neox"
    config = PreprocessConfig(inputs=[str(folder)], tokenizer=neox_path, output_prefix=str(prefix), append_eod=True,
                              valid_fraction=0.1, test_fraction=0.1, workers=0, progress=False)
    run_preprocess(config)
    assert [len(read_split(str(prefix), split)) for split in ("train", "valid")] == [150, 40]
    assert not (tmp_path / "out" / "neox_test.bin").exists()
    assert "its splits are used as they are (train -> train, validation -> valid)" in capsys.readouterr().err
    other = tmp_path / "unsupervised"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[:5]}),
                          "unsupervised": datasets.Dataset.from_dict({"text": texts[5:9]})}).save_to_disk(str(other))
    with pytest.raises(PreprocessError, match=f"split\\(s\\) unsupervised.*--input {other}/unsupervised"):
        run_preprocess(PreprocessConfig(inputs=[str(other)], tokenizer=neox_path,
                                        output_prefix=str(tmp_path / "other" / "neox"), workers=0, progress=False))
    assert not (tmp_path / "other").exists()
