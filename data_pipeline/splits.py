"""Train/valid/test assignment by a stable hash of a document's text.

The split depends only on the text, so it is the same whatever the worker count, the input order
or the file a document came from; duplicated documents always land in the same split, which keeps
exact copies of test documents out of the training data.
"""

from __future__ import annotations

import hashlib

SPLITS = ("train", "valid", "test")
_SCALE = float(2**64)


def split_of(text: bytes, valid_fraction: float, test_fraction: float) -> str:
    """'test' for the lowest `test_fraction` of hash values, then 'valid', else 'train'.

    Test comes first so that raising the validation fraction never moves a test document.
    """
    u = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") / _SCALE
    if u < test_fraction:
        return "test"
    if u < test_fraction + valid_fraction:
        return "valid"
    return "train"
