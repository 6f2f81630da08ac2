"""Build the bundled corpus `data/corpus/shakespeare.jsonl.zst` from the Gutenberg texts.

    python -m data_pipeline.corpora.shakespeare shakespeare-gutenberg-texts.tar.xz \\
        --output data/corpus/shakespeare.jsonl.zst

Input: the tar of `*_gut.txt` plays and poems (plus `metadata.txt` with their titles) from the
`shakespeare` 0.6 package of the Open Knowledge Foundation.  Each text loses any Project
Gutenberg header and footer, its title lines and a closing "THE END"; plays are cut into one
document per scene (per act when a play marks no scenes, with any prologue or front matter as
documents of their own); the sonnets become groups of ten; other poems stay whole.  Output: one
JSON object per line, `{"text", "title", "id"}`, zstd-compressed, byte-identical between runs.
"""

from __future__ import annotations

import argparse
import configparser
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

NUMERAL = r"(?:[IVXLC]+|\d+|FIRST|SECOND|THIRD|FOURTH|FIFTH)"
ACT_LINE = re.compile(rf"^\s*ACT\s+{NUMERAL}\.?\s*$", re.IGNORECASE)
SCENE_LINE = re.compile(r"^\s*SCENE\s+(?:[IVXLC]+|\d+)(?=[.\s:-]|$)", re.IGNORECASE)
SECTION_LINE = re.compile(r"^\s*[IVXLC]+\.?\s*$")  # a numbered sonnet
PG_START = re.compile(r"^\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$|^\*END\*THE SMALL PRINT.*$",
                      re.IGNORECASE | re.MULTILINE)
PG_END = re.compile(r"^\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*$|^End of (the )?Project Gutenberg.*$",
                    re.IGNORECASE | re.MULTILINE)
SECTIONS_PER_DOCUMENT = 10


@dataclass
class Document:
    text: str
    title: str
    id: str


def strip_gutenberg(text: str) -> str:
    """The body between Project Gutenberg's start and end markers (the whole text without them)."""
    text = text.replace("\r\n", "\n")
    start = PG_START.search(text)
    if start:
        text = text[start.end():]
    end = PG_END.search(text)
    if end:
        text = text[: end.start()]
    return text


def strip_title(text: str) -> str:
    """Drop the leading 'TITLE / by William Shakespeare' lines and a closing 'THE END'."""
    lines = text.strip("\n").split("\n")
    for i, line in enumerate(lines[:8]):
        if line.strip().lower() == "by william shakespeare":
            lines = lines[i + 1:]
            break
    while lines and lines[-1].strip() in ("", "THE END"):
        lines.pop()
    return "\n".join(lines).strip("\n")


def split_play(body: str) -> list[str]:
    """Scenes (or acts) headed by their act; text between headings (prologues) is a part of its own."""
    lines = body.split("\n")
    has_scenes = any(SCENE_LINE.match(line) for line in lines)
    parts: list[str] = []
    current: list[str] = []
    has_body = False  # whether `current` holds more than an act heading
    act = ""
    for line in lines:
        is_act = bool(ACT_LINE.match(line))
        is_scene = has_scenes and bool(SCENE_LINE.match(line))
        if (is_act or is_scene) and has_body:
            parts.append("\n".join(current).strip("\n"))
            current, has_body = [], False
        if is_act:
            act = line.strip()
            current = [act, ""]
            continue
        if is_scene and not current and act:
            current = [act, ""]
        if not has_body and not is_scene and not line.strip():
            continue  # blank lines before a part's first text
        current.append(line)
        has_body = has_body or bool(line.strip())
    if has_body:
        parts.append("\n".join(current).strip("\n"))
    return parts


def split_sections(body: str) -> list[str]:
    """Groups of numbered sections (sonnets); the whole poem when it has too few to group."""
    lines = body.split("\n")
    starts = [i for i, line in enumerate(lines) if SECTION_LINE.match(line)]
    if len(starts) < 2 * SECTIONS_PER_DOCUMENT:
        return [body]
    cuts = [0] + starts[SECTIONS_PER_DOCUMENT::SECTIONS_PER_DOCUMENT] + [len(lines)]
    return ["\n".join(lines[a:b]).strip("\n") for a, b in zip(cuts[:-1], cuts[1:])]


def documents_of(name: str, raw: str, title: str) -> list[Document]:
    body = strip_title(strip_gutenberg(raw))
    is_play = any(ACT_LINE.match(line) for line in body.split("\n"))
    parts = split_play(body) if is_play else split_sections(body)
    work = name.removesuffix("_gut.txt")
    return [Document(text, title, f"{work}-{k:03d}") for k, text in enumerate(parts)]


def read_tar(path: str) -> list[Document]:
    """All documents of the tar, works in file-name order."""
    with tarfile.open(path) as tar:
        members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        titles = configparser.ConfigParser(interpolation=None)
        if "metadata.txt" in members:
            titles.read_string(cast(IO[bytes], tar.extractfile(members["metadata.txt"])).read().decode("utf-8"))
        documents: list[Document] = []
        for name in sorted(n for n in members if n.endswith("_gut.txt")):
            raw = cast(IO[bytes], tar.extractfile(members[name])).read().decode("utf-8")  # members: files
            section = name.removesuffix(".txt")
            title = titles.get(section, "title", fallback=None) or raw.strip().split("\n")[0].strip().title()
            documents.extend(documents_of(name, raw, title))
    return documents


def write_jsonl_zst(documents: list[Document], output: str) -> None:
    import zstandard

    lines = "".join(json.dumps({"text": d.text, "title": d.title, "id": d.id}, ensure_ascii=False) + "\n"
                    for d in documents)
    data = zstandard.ZstdCompressor(level=19).compress(lines.encode("utf-8"))
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(output + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_pipeline.corpora.shakespeare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tar", help="shakespeare-gutenberg-texts.tar.xz")
    parser.add_argument("--output", default="data/corpus/shakespeare.jsonl.zst")
    args = parser.parse_args(argv)
    documents = read_tar(args.tar)
    write_jsonl_zst(documents, args.output)
    characters = sum(len(d.text) for d in documents)
    works = len({d.id.rsplit("-", 1)[0] for d in documents})
    print(f"{args.output}: {len(documents)} documents from {works} works, {characters:,} characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

