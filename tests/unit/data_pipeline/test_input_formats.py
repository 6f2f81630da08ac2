"""Every input format reads to the same documents: parquet, jsonl.zst, json.gz, save_to_disk."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.splits import SPLITS


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
                          "extra": datasets.Dataset.from_dict({"text": [good[2]]})}).save_to_disk(str(dict_dir))

    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(PreprocessConfig(
        inputs=[str(binary), str(no_column), str(dict_dir)], tokenizer=neox_path, output_prefix=str(prefix),
        append_eod=True, valid_fraction=0.3, test_fraction=0.3, workers=0, progress=False))

    assert stats["skipped"] == {"invalid_utf8": 1, "missing_text": 3, "empty_text": 2}
    assert stats["skipped_examples"]["invalid_utf8"] == [f"{binary}:row 1"]
    assert stats["skipped_examples"]["missing_text"] == [f"{binary}:row 2", f"{no_column}:row 0",
                                                          f"{no_column}:row 1"]
    assert stats["skipped_examples"]["empty_text"] == [f"{binary}:row 3", f"{dict_dir}[train]:row 1"]
    expected = expected_split_docs(neox, [good[0], good[2], good[1]], 0.3, 0.3)  # DatasetDict: sorted splits
    for split in SPLITS:
        assert read_split(str(prefix), split) == expected[split]
