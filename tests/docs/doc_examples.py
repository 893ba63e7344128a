"""The shell and Python examples of README.md and docs/, and the markers that say how to run them.

An HTML comment on the line before a fenced block (invisible on the rendered page):

- ``<!-- run -->``: run the block (``sh`` with bash, ``python`` with this Python,
  ``javascript`` with node as an ES module that can import ``@edge-llm/client``);
- ``<!-- run: server [FLAGS] -->``: run it against an engine started with these
  serve flags, shared by the page's blocks that name the same flags; the block's
  ``127.0.0.1:8000`` (what ``make run`` serves) is pointed at that engine;
- ``<!-- skip: REASON -->``: not run, and why;
- ``<!-- output -->``: this block is what the block before it prints (stdout and
  stderr), with typed wildcards for what varies between runs and machines:
  ``<number>`` (an integer or decimal, ``-0.99``, ``1,234``), ``<id>`` (letters,
  digits, ``_`` and ``-``: ``chatcmpl-<id>``), ``<duration>`` (a number with ``ms``
  or ``s``), ``<value>`` (a JSON scalar: number, ``null``, ``true``, ``false`` or a
  string), ``<text>`` (some text within the line, for a free-form message); two
  or more spaces stand for any run of spaces (a table column's padding follows the
  width of what it holds); a line that is only ``...`` stands for any number of
  lines, none included, and only between two lines it must match (never first or
  last: it would swallow a traceback or retry noise before or after the output).

Every ``sh``/``bash``/``shell``/``console``/``python``/``javascript`` block must carry run or skip.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]
CODE_LANGUAGES = {
    "sh": "sh",
    "bash": "sh",
    "shell": "sh",
    "console": "sh",
    "python": "python",
    "javascript": "js",
}
WILDCARD_LINES = "..."
# Each typed wildcard and what it matches (within one line).
WILDCARDS = {
    "<number>": r"-?\d[\d,]*(?:\.\d+)?",
    "<id>": r"[0-9A-Za-z][0-9A-Za-z_-]*",
    "<duration>": r"\d+(?:\.\d+)? ?(?:ms|s)",
    "<value>": r'-?\d[\d,]*(?:\.\d+)?|null|true|false|"[^"\n]*"',
    "<text>": r"[^\n]+?",
}
_WILDCARD = re.compile("|".join(re.escape(name) for name in WILDCARDS))
_PADDING = re.compile("  +")
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*(run|skip|output)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    page: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    language: str  # "sh", "python" or "js"
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
        if block.marker == "output":
            problems.extend(f"{where}: {problem}" for problem in output_problems(block.text))
    return problems


def output_problems(expected: str) -> list[str]:
    """What an expected output must not do: open or end with a ``...`` line (it would
    swallow what comes before or after), or use ``...`` inside a line (the old
    untyped wildcard: say what varies with a typed one)."""
    lines = _normalise(expected).splitlines()
    problems = []
    if lines and WILDCARD_LINES in (lines[0].strip(), lines[-1].strip()):
        problems.append("an output opens or ends with a '...' line")
    if any(WILDCARD_LINES in line and line.strip() != WILDCARD_LINES for line in lines):
        problems.append("'...' inside an output line: use a typed wildcard (<number>, <id>, ...)")
    return problems


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _line_pattern(line: str) -> str:
    if line.strip() == WILDCARD_LINES:
        return "(?:[^\n]*\n)*?"  # any number of whole lines
    pieces = [_literal(piece) for piece in _WILDCARD.split(line)]
    wildcards = [WILDCARDS[name] for name in _WILDCARD.findall(line)]
    pattern = pieces[0]
    for wildcard, piece in zip(wildcards, pieces[1:], strict=True):
        pattern += f"(?:{wildcard}){piece}"
    return pattern + "\n"


def _literal(text: str) -> str:
    """``text`` as a pattern, a run of two or more spaces matching any run of spaces."""
    return " +".join(re.escape(part) for part in _PADDING.split(text))


def matches(expected: str, actual: str) -> bool:
    """Whether the output is the expected text, with its wildcards (see the module doc).
    Raises ValueError for an expected text that breaks :func:`output_problems`' rules."""
    problems = output_problems(expected)
    if problems:
        raise ValueError("; ".join(problems))
    pattern = "".join(_line_pattern(line) for line in _normalise(expected).splitlines())
    return re.fullmatch(pattern, _normalise(actual) + "\n") is not None
