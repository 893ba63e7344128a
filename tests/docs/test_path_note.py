"""The README and the docs' home say how to get the ``edge-llm`` and ``python``
commands their examples use bare (the virtualenv), before the first such example."""

from __future__ import annotations

import re

import pytest

from doc_examples import ROOT, examples

ACTIVATE = "source .venv/bin/activate"
# A command word at the start of a line or after a pipe, ;, &&, ( or $(.
_BARE = re.compile(r"(?:^|[|;&(]\s*|\$\()\s*(edge-llm|python)\b", re.MULTILINE)


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_path_note_comes_before_the_first_bare_command(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert ACTIVATE in text and ".venv/bin/edge-llm" in text and "make run" in text
    note_line = text[: text.index(ACTIVATE)].count("\n") + 1
    bare = [e for e in examples(ROOT / page) if e.language == "sh" and _BARE.search(e.code)]
    assert bare, f"{page} has no example using edge-llm or python"
    assert note_line <= bare[0].line, f"{page}:{bare[0].line} uses a bare command before the note"


def test_the_bare_command_pattern() -> None:
    assert _BARE.search("edge-llm serve")
    assert _BARE.search("GEMMA=$(python -c 'x')")
    assert _BARE.search("curl x | python -m json.tool")
    assert not _BARE.search(".venv/bin/edge-llm serve")
    assert not _BARE.search("make run  # edge-llm serve")
