"""What a crafted file from elsewhere holds, made harmless: unpickled by the full unpickler, it
writes a marker file, so a test sees whether anything ran it."""

from __future__ import annotations

from pathlib import Path


class WritesMarker:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "the pickle ran")
