"""The split hash: stable, proportional, and test documents stay put when fractions change."""

from __future__ import annotations

from collections import Counter

from data_pipeline.splits import split_of


def test_split_fractions_and_stability():
    texts = [f"document number {i}".encode() for i in range(20000)]
    counts = Counter(split_of(t, 0.05, 0.001) for t in texts)
    assert abs(counts["test"] - 20) <= 12 and abs(counts["valid"] - 1000) <= 100
    assert split_of(b"To be, or not to be", 0.05, 0.001) == split_of(b"To be, or not to be", 0.05, 0.001)
    test_before = {t for t in texts if split_of(t, 0.05, 0.001) == "test"}
    test_after = {t for t in texts if split_of(t, 0.2, 0.001) == "test"}
    assert test_before == test_after  # a larger validation share never moves test documents
    assert {split_of(t, 0.0, 0.0) for t in texts} == {"train"}
