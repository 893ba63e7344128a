"""The shell and Python examples of README.md and docs/, and the markers that say how to run them.

An HTML comment on the line before a fenced block (invisible on the rendered page):

- ``<!-- run -->``: run the block (``sh`` with bash, ``python`` with this Python);
- ``<!-- run: server [FLAGS] -->``: run it against an engine started with these
  serve flags, shared by the page's blocks that name the same flags; the block's
  ``127.0.0.1:8000`` (what ``make run`` serves) is pointed at that engine;
- ``<!-- skip: REASON -->``: not run, and why;
- ``<!-- output -->``: this block is what the block before it prints (stdout and
  stderr); ``...`` inside a line stands for any text in that line, a line that is
  only ``...`` for any number of lines, none included.

Every ``sh``/``bash``/``shell``/``console``/``python`` block must carry run or skip.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]
CODE_LANGUAGES = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "sh", "python": "python"}
WILDCARD = "..."
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*(run|skip|output)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    page: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    language: str  # "sh" or "python"
    code: str
    run: bool
    server_flags: tuple[str, ...] | None  # None: no server
    expected: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class _Block:
    line: int
    language: str
    text: str
    marker: str | None  # "run", "skip" or "output"
    argument: str


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _blocks(text: str) -> list[_Block]:
    lines = text.splitlines()
    blocks: list[_Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        marker = _MARKER.match(lines[index - 1]) if index > 0 else None
        blocks.append(
            _Block(
                line=index + 1,
                language=fence.group(1),
                text="\n".join(lines[index + 1 : end]) + "\n",
                marker=marker.group(1) if marker else None,
                argument=(marker.group(2) or "") if marker else "",
            )
        )
        index = end + 1
    return blocks


def _example(page: str, block: _Block, following: _Block | None) -> Example:
    words = shlex.split(block.argument)
    if words and words[0] != "server":
        raise ValueError(f"{page}:{block.line}: run takes nothing or 'server [FLAGS]'")
    expected = following.text if following and following.marker == "output" else None
    return Example(
        page=page,
        line=block.line,
        language=CODE_LANGUAGES[block.language],
        code=block.text,
        run=True,
        server_flags=tuple(words[1:]) if words else None,
        expected=expected,
    )


def examples(path: Path, root: Path = ROOT) -> list[Example]:
    """The runnable examples of one page, in order."""
    page = str(path.relative_to(root))
    blocks = _blocks(path.read_text(encoding="utf-8"))
    found = []
    for index, block in enumerate(blocks):
        if block.marker == "run":
            following = blocks[index + 1] if index + 1 < len(blocks) else None
            found.append(_example(page, block, following))
    return found


def unmarked(path: Path, root: Path = ROOT) -> list[str]:
    """Problems: code blocks without run/skip, run on a non-code block, stray outputs."""
    page = str(path.relative_to(root))
    blocks = _blocks(path.read_text(encoding="utf-8"))
    problems = []
    for index, block in enumerate(blocks):
        where = f"{page}:{block.line}"
        is_code = block.language in CODE_LANGUAGES
        if is_code and block.marker not in ("run", "skip"):
            problems.append(f"{where}: a {block.language} block without run or skip marker")
        if block.marker == "run" and not is_code:
            problems.append(f"{where}: <!-- run --> on a {block.language or 'plain'} block")
        if block.marker == "skip" and not block.argument:
            problems.append(f"{where}: <!-- skip --> without a reason")
        previous = blocks[index - 1] if index > 0 else None
        if block.marker == "output" and (previous is None or previous.marker != "run"):
            problems.append(f"{where}: <!-- output --> not after a run block")
    return problems


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _line_pattern(line: str) -> str:
    if line.strip() == WILDCARD:
        return "(?:[^\n]*\n)*?"  # any number of whole lines
    return "[^\n]*?".join(re.escape(piece) for piece in line.split(WILDCARD)) + "\n"


def matches(expected: str, actual: str) -> bool:
    """Whether the output is the expected text, with its wildcards (see the module doc)."""
    pattern = "".join(_line_pattern(line) for line in _normalise(expected).splitlines())
    return re.fullmatch(pattern, _normalise(actual) + "\n") is not None
