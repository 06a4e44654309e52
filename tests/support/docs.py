"""The runnable blocks of the documentation, which the tests run as written."""

from __future__ import annotations

import re
from pathlib import Path

BLOCK = re.compile(r"^(?P<indent> *)```(?P<lang>sh|python)\n(?P<body>.*?)^(?P=indent)```$", re.M | re.S)


def doc_blocks(path: Path, section: str | None = None) -> list[tuple[str, str]]:
    """The (language, code) of each ``sh``/``python`` block of ``path`` (of its ``## section`` only, if given)."""
    text = path.read_text()
    if section is not None:
        start = text.index(f"## {section}\n")
        end = text.find("\n## ", start + 1)
        text = text[start:end if end >= 0 else None]
    blocks = []
    for match in BLOCK.finditer(text):
        indent = len(match["indent"])
        body = "".join(line[indent:] for line in match["body"].splitlines(keepends=True))
        blocks.append((match["lang"], body))
    return blocks
