"""Benchmark runs become dated pages generated from their JSON, and nothing published
in the repository differs from what its stored runs generate."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from edge_llm.bench.publish import (
    HEADLINE_BEGIN,
    HEADLINE_END,
    INDEX_BEGIN,
    INDEX_END,
    ROOT,
    PublishError,
    check,
    headline_markers,
    publish,
    render_headline,
    render_index,
    run_header,
    table_data,
)

MACHINE = {
    "wall_s": 412.0,
    "cores": 2,
    "others_cpu_s": 8.0,
    "loadavg_start": [0.4, 0.3, 0.2],
    "loadavg_end": [2.1, 1.0, 0.5],
    "busiest": ["6.0 CPU-s pid 12: pytest"],
    "others_share": 0.0097,
}


def document(
    started: str, decode: str = "104 (96-119)", argv: list[str] | None = None, cold: bool = False
) -> dict[str, Any]:
    when = datetime.fromisoformat(started).replace(tzinfo=UTC)
    argv = ["benchmarks/vs_llama_server.py", "--repeats", "2", *(argv or [])]
    header = run_header(
        "vs_llama_server", "edge-llm vs llama-server", when, MACHINE, notes=["layout slots"],
        argv=argv,
    )  # fmt: skip
    columns = ("scenario", "edge-llm", "llama-server | peer", "goal")
    rows = [["single-stream decode", decode, "107 (94-143)", ">= 1.0x"]]
    if cold:
        rows.append(["cold TTFT", "1.9", "1.7", "<= 1.0x"])
    return {"run": header, "tables": [table_data("2 repeat(s)", columns, rows)], "results": {}}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "README.md").write_text(f"# x\n\n{HEADLINE_BEGIN}\nold\n{HEADLINE_END}\n\nend\n")
    index = tmp_path / "docs" / "benchmarks" / "index.md"
    index.write_text(f"# Benchmarks\n\n{INDEX_BEGIN}\nold\n{INDEX_END}\n")
    return tmp_path


def test_a_run_becomes_a_dated_page_with_its_command_load_and_tables(repo: Path) -> None:
    page = publish(document("2026-12-03T11:01:05"), root=repo)
    assert page == repo / "docs/benchmarks/2026-12-03-vs-llama-server.md"
    text = page.read_text()
    assert text.startswith("# edge-llm vs llama-server, 2026-12-03\n")
    assert "Started 2026-12-03 11:01:05 UTC" in text
    assert "```\n.venv/bin/python benchmarks/vs_llama_server.py --repeats 2\n```" in text
    assert "Other processes used 8 CPU-s in 412 s (1% of 2 cores)" in text
    assert "load average 0.40 at start, 2.10 at end" in text
    assert "| single-stream decode | 104 (96-119) | 107 (94-143) | >= 1.0x |" in text
    assert "| scenario | edge-llm | llama-server \\| peer | goal |" in text
    stored = json.loads((repo / "docs/benchmarks/runs/2026-12-03-vs-llama-server.json").read_text())
    assert set(stored) == {"run", "tables"}


def test_the_index_and_readme_show_the_latest_run(repo: Path) -> None:
    publish(document("2026-12-02T13:00:00", decode="90"), root=repo)
    publish(document("2026-12-03T11:01:05", decode="130"), root=repo)
    publish(document("2026-12-03T15:30:00", decode="140"), root=repo)
    index = (repo / "docs/benchmarks/index.md").read_text()
    assert "[edge-llm vs llama-server, 2026-12-03](2026-12-03-1530-vs-llama-server.md)" in index
    assert "[2026-12-03](2026-12-03-vs-llama-server.md), [2026-12-02]" in index
    readme = (repo / "README.md").read_text()
    assert "| single-stream decode | 140 |" in readme
    assert "(docs/benchmarks/2026-12-03-1530-vs-llama-server.md)" in readme
    assert readme.endswith("\n\nend\n") and "old" not in readme
    assert check(repo) == []


def test_a_run_of_fewer_scenarios_is_listed_but_the_fullest_latest_run_stays_the_headline(
    repo: Path,
) -> None:
    """A run of a few scenarios (a variant's cost, say) is the index's latest run; the
    README keeps the latest of the runs that measured the most scenarios."""
    publish(document("2026-12-03T11:01:05", decode="130", cold=True), root=repo)
    publish(document("2026-12-03T15:30:00", decode="140"), root=repo)
    index = (repo / "docs/benchmarks/index.md").read_text()
    assert "[edge-llm vs llama-server, 2026-12-03](2026-12-03-1530-vs-llama-server.md)" in index
    readme = (repo / "README.md").read_text()
    assert "| single-stream decode | 130 |" in readme and "| cold TTFT |" in readme
    publish(document("2026-12-04T09:00:00", decode="150", cold=True), root=repo)
    assert "| single-stream decode | 150 |" in (repo / "README.md").read_text()
    assert check(repo) == []


def test_runs_started_in_the_same_minute_get_pages_of_their_own(repo: Path) -> None:
    """Runs started in one minute or one second (two soaks side by side): no page
    replaces another."""
    first = publish(document("2026-12-03T11:01:05", decode="90"), root=repo)
    second = publish(document("2026-12-03T16:07:04", decode="130"), root=repo)
    third = publish(document("2026-12-03T16:07:06", decode="140"), root=repo)
    fourth = publish(document("2026-12-03T16:07:06", decode="150", argv=["--x"]), root=repo)
    assert [p.name for p in (first, second, third, fourth)] == [
        "2026-12-03-vs-llama-server.md",
        "2026-12-03-1607-vs-llama-server.md",
        "2026-12-03-160706-vs-llama-server.md",
        "2026-12-03-160706-2-vs-llama-server.md",
    ]
    assert "| 130 |" in second.read_text() and "| 140 |" in third.read_text()
    assert publish(document("2026-12-03T16:07:06", decode="140"), root=repo) == third
    assert check(repo) == []


def test_check_reports_a_page_edited_by_hand_and_a_stale_readme(repo: Path) -> None:
    page = publish(document("2026-12-03T11:01:05"), root=repo)
    page.write_text(page.read_text().replace("104 (96-119)", "120 (96-119)"))
    readme = repo / "README.md"
    readme.write_text(readme.read_text().replace("104 (96-119)", "99"))
    problems = check(repo)
    assert len(problems) == 2
    assert "2026-12-03-vs-llama-server.md is not what" in problems[0]
    assert "README.md: the generated part is stale" in problems[1]


def test_a_document_without_a_run_header_is_refused(repo: Path) -> None:
    with pytest.raises(PublishError, match="no 'run' header"):
        publish({"results": {}}, root=repo)


def test_rows_must_fill_every_column() -> None:
    with pytest.raises(PublishError, match="every row needs 2 cells"):
        table_data("t", ["a", "b"], [["only one"]])


def test_with_no_run_the_readme_points_at_the_history() -> None:
    assert "docs/benchmarks/history.md" in render_headline([])
    assert "No run has been published yet." in render_index([])


def test_what_the_repository_publishes_is_what_its_stored_runs_generate() -> None:
    assert check(ROOT) == [], "run: .venv/bin/python -m edge_llm.bench.publish --check"


def test_another_benchmarks_headline_goes_where_the_readme_marks_it(repo: Path) -> None:
    begin, end = headline_markers("kv_quant")
    readme = repo / "README.md"
    readme.write_text(readme.read_text() + f"\n{begin}\nold\n{end}\n")
    doc = document("2026-12-03T11:01:05")
    doc["run"] = {**doc["run"], "benchmark": "kv_quant", "title": "KV types"}
    publish(doc, root=repo)
    text = readme.read_text()
    kv_part = text[text.index(begin) : text.index(end)]
    assert "| single-stream decode | 104 (96-119) |" in kv_part
    assert "2026-12-03-kv-quant.md" in kv_part
    assert "No run has been published" in text  # the llama-server headline still waits
    assert check(repo) == []


def test_a_benchmark_the_readme_does_not_mark_stays_out_of_it(repo: Path) -> None:
    doc = document("2026-12-03T11:01:05")
    doc["run"] = {**doc["run"], "benchmark": "soak", "title": "Soak"}
    publish(doc, root=repo)
    assert "104 (96-119)" not in (repo / "README.md").read_text()
    assert check(repo) == []
