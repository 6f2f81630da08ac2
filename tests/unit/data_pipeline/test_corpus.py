"""The bundled corpus and the script that builds it."""

from __future__ import annotations

from data_pipeline.corpora.shakespeare import documents_of, strip_gutenberg

PLAY = """\ufeffThe Project Gutenberg EBook of A Test Play
*** START OF THIS PROJECT GUTENBERG EBOOK A TEST PLAY ***
A TEST PLAY

by William Shakespeare

PERSONS REPRESENTED.
HAMLET, a prince.

ACT I.

SCENE 1. A room.

HAMLET.
Words, words, words.

SCENE II. Another room.

HAMLET.
The rest is silence.

ACT II.

PROLOGUE.
A chorus speaks.

Scene 1. A third room.

HAMLET.
Adieu.

THE END
*** END OF THIS PROJECT GUTENBERG EBOOK A TEST PLAY ***
This file should be named test.txt; licence follows.
"""


def test_gutenberg_matter_is_stripped_and_plays_split_by_scene():
    body = strip_gutenberg(PLAY)
    assert "PROJECT GUTENBERG" not in body.upper() and "licence" not in body
    documents = documents_of("test_play_gut.txt", PLAY, "A Test Play")
    assert [d.id for d in documents] == [f"test_play-{k:03d}" for k in range(5)]
    front, first, second, prologue, third = (d.text for d in documents)
    assert front.startswith("PERSONS REPRESENTED.") and "by William" not in front
    assert first.startswith("ACT I.\n\nSCENE 1. A room.") and first.endswith("Words, words, words.")
    assert second.startswith("ACT I.\n\nSCENE II.") and "silence" in second
    assert prologue.startswith("ACT II.\n\nPROLOGUE.")
    assert third.startswith("ACT II.\n\nScene 1.") and third.endswith("Adieu.")


def test_bundled_corpus_has_hundreds_of_scene_documents(corpus):
    assert 500 <= len(corpus) <= 1200
    assert all(set(d) == {"text", "title", "id"} and d["text"].strip() for d in corpus)
    assert len({d["id"] for d in corpus}) == len(corpus)
    hamlet = [d for d in corpus if d["id"].startswith("hamlet-")]
    assert len(hamlet) == 21 and hamlet[0]["title"] == "Hamlet"
    assert not any("gutenberg" in d["text"].lower() for d in corpus)
