"""A word-level tokenizer of any size: the tokenizer of tiny models whose vocabulary no real one fits."""

from __future__ import annotations

from pathlib import Path


def write_word_tokenizer(path: Path, size: int) -> Path:
    """tokenizer.json (xz-compressed where the name ends in .xz, as data/tokenizers/ holds them) with ids
    0..size-1: <|endoftext|> (the end of a document), <unk>, w2, w3, ..."""
    import lzma

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = Tokenizer(WordLevel({"<|endoftext|>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, size)}}, "<unk>"))
    words.pre_tokenizer = Whitespace()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = words.to_str()
    path.write_bytes(lzma.compress(text.encode()) if path.name.endswith(".xz") else text.encode())
    return path
