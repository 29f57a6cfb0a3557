"""Each benchmark owns one section of docs/benchmarks.md, between its own begin and
end markers, and rewrites only that: running one benchmark never loses another's
table."""

from __future__ import annotations

from pathlib import Path

HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the script it names; edit the script, not the table.\n"
)


def write_section(path: Path, begin: str, end: str, section: str) -> None:
    """Put ``section`` (which starts with ``begin`` and ends with ``end``) in ``path``,
    in place of the old one, or at the end of the file if there was none."""
    text = path.read_text() if path.exists() else HEADER
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + section.rstrip("\n").removesuffix(end).rstrip("\n") + "\n" + end + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    path.write_text(text)
