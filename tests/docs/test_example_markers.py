"""Every shell and Python example in the docs is marked runnable or skipped with a reason,
and the output check tells matching output from other output."""

from __future__ import annotations

from pathlib import Path

import pytest

from doc_examples import examples, matches, output_problems, pages, unmarked


def test_every_code_block_is_marked_run_or_skip_with_a_reason() -> None:
    problems = [problem for page in pages() for problem in unmarked(page)]
    assert not problems, "\n".join(problems)


def test_the_docs_have_runnable_examples_with_outputs() -> None:
    found = [example for page in pages() for example in examples(page)]
    assert any(e.language == "python" and e.server_flags is not None for e in found)
    assert any(e.language == "sh" and e.server_flags is None for e in found)
    assert sum(e.expected is not None for e in found) >= len(found) // 2


@pytest.mark.parametrize(
    ("expected", "actual", "result"),
    [
        ("paused: client\n", "paused: client\n\n", True),
        ("paused: client", "paused: socket_full", False),
        ("ttft <number> ms, 8 tokens", "ttft 95 ms, 8 tokens", True),
        ("ttft <number> ms, 8 tokens", "ttft 95 ms, 9 tokens", False),
        ("ttft <number> ms, 8 tokens", "ttft None ms, 8 tokens", False),
        ("ttft <number> ms", "ttft 95 ms; retrying", False),
        ("<number> <number> <number>", "-0.99 1,234 7", True),
        ("<number>", "1.2.3", False),
        ("waited <duration>", "waited 1.5 s", True),
        ("waited <duration>", "waited 95ms", True),
        ("waited <duration>", "waited 95", False),
        ("id chatcmpl-<id>", "id chatcmpl-52744f5b_aa", True),
        ("id chatcmpl-<id>", "id chatcmpl-", False),
        ("id <id>", "id two words", False),
        ('{"q": <value>, "s": <value>}', '{"q": null, "s": "prefill"}', True),
        ('{"q": <value>}', '{"q": [1]}', False),
        ("error: <text>", "error: it broke", True),
        ("error: <text>", "error: ", False),
        ("a <text> c", "a b\nc", False),
        ("first\n...\nlast", "first\nmiddle\nmore\nlast", True),
        ("first\n...\nlast", "first\nlast", True),
        ("first\n...\nlast", "first\nmiddle\nlast but one", False),
        ("a  \nb", "a\nb   ", True),
        ("40      1  <number> ms", "40      1     12 ms", True),  # column padding
        ("40      1  <number> ms", "40 1 1234 ms", True),
        ("40 1", "40  1", False),  # a single space stays one
        ('a (1+1) [x] {"id": 1}', 'a (1+1) [x] {"id": 1}', True),
    ],
)
def test_output_matching(expected: str, actual: str, result: bool) -> None:
    assert matches(expected, actual) is result


@pytest.mark.parametrize("expected", ["...\nlast", "first\n...", "ttft ... ms", "  ...  \nlast"])
def test_an_output_that_could_swallow_anything_is_refused(expected: str) -> None:
    assert output_problems(expected)
    with pytest.raises(ValueError):
        matches(expected, "last")


def test_a_code_block_without_a_marker_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("Text.\n\n```sh\nls\n```\n\n<!-- skip -->\n```python\npass\n```\n")
    problems = unmarked(page, root=tmp_path)
    assert len(problems) == 2
    assert "docs/page.md:3: a sh block without run or skip" in problems[0]
    assert "without a reason" in problems[1]
