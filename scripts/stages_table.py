"""Rewrite the table of analysis stages in docs/ARCHITECTURE.md from the code (tests/test_stages.py checks it)."""

from __future__ import annotations

from pathlib import Path

from dsprof.analysis import analyze, layout  # noqa: F401  (importing them declares every stage)
from dsprof.analysis.stages import stages_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
HEADER = "| stage | reads | writes | what it does |"


def main() -> None:
    text = DOC.read_text()
    start = text.index(HEADER)
    end = text.index("\n\n", start)
    DOC.write_text(text[:start] + stages_markdown() + text[end:])


if __name__ == "__main__":
    main()
