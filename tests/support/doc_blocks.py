"""The fenced code blocks of the documentation (README.md and docs/**/*.md), as the docs test runs them.

A page's blocks run in order, in one working directory per page:

- a block with a ``title="NAME"`` (MkDocs Material shows it as the file name above the block) is a file
  the reader saves: it is written to NAME in the page's directory, and later blocks use it;
- a ``bash`` / ``sh`` / ``shell`` block without a title runs as a bash script (``set -euo pipefail``);
- a ``python`` block without a title runs as ``python <file>`` (a file, so that workers started with the
  spawn method can import it again);
- other blocks (``text``, output, tables of figures) are not run.

A block opts out of running only with a visible first line ``# not run by the docs test: <reason>``
(a command that needs a GPU, several machines or a network); ``tests/multiprocess/docs/test_docs_examples.py``
lists every such block, so a new one is a visible change there.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re

from tests.support.helpers import REPO

SHELL = ("bash", "sh", "shell")
SKIP_PREFIX = "# not run by the docs test:"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # the opening fence's line number (1-based)
    lang: str
    title: str | None
    body: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        first = next((line.strip() for line in self.body.splitlines() if line.strip()), "")
        return first[len(SKIP_PREFIX):].strip() if first.startswith(SKIP_PREFIX) else None

    @property
    def runs(self) -> bool:
        return self.title is None and self.lang in SHELL + ("python",) and self.skip_reason is None


def pages() -> list[str]:
    """README.md and every page under docs/, relative to the repository root, sorted."""
    found = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
    return ["README.md", *found]


def blocks(page: str) -> list[Block]:
    """The fenced blocks of one page, in order (indented fences, as inside a list item, included)."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening.group("indent"), opening.group("fence"), opening.group("info").strip()
        lang = info.split()[0].lower() if info else ""
        title = _TITLE.search(info)
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        found.append(Block(page, i + 1, lang, title.group("title") if title else None, "\n".join(body) + "\n"))
        i = j + 1
    return found


def page_blocks() -> dict[str, list[Block]]:
    """Every page that has a block to run or a file to write, with its blocks."""
    found = {page: blocks(page) for page in pages()}
    return {page: bs for page, bs in found.items() if any(b.runs or b.title for b in bs)}


def skipped() -> list[Block]:
    """Every block that opts out of running, in page order."""
    return [b for page in pages() for b in blocks(page) if b.lang in SHELL + ("python",) and b.skip_reason]
