"""Headline tables live on the benchmarks page; the README keeps one generated line:
the llama-server comparison's median ratios, copied from the run, never retyped."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edge_llm.bench.publish import (
    HEADLINE_BEGIN,
    HEADLINE_END,
    INDEX_BEGIN,
    INDEX_END,
    ROOT,
    SUMMARY_BEGIN,
    SUMMARY_END,
    check,
    headline_markers,
    publish,
    run_header,
    table_data,
)

MACHINE = {"wall_s": 300.0, "cores": 2, "others_cpu_s": 3.0, "others_share": 0.01,
           "loadavg_start": [0.5], "loadavg_end": [2.0]}  # fmt: skip
COLUMNS = ("scenario", "unit", "edge-llm median", "llama-server median",
           "ratio edge/llama min / median / max", "goal")  # fmt: skip
ROWS = [
    ["single-stream decode", "tok/s", "101", "109", "0.81 / 0.93 / 1.10", ">= 1.0x"],
    ["4 streams, aggregate decode", "tok/s", "131", "148", "0.88 / 0.91 / 0.93", ">= 1.2x"],
    ["single-stream decode (steady)", "tok/s", "112", "118", "0.93 / 0.95 / 0.95", ">= 1.0x"],
]


def document(benchmark: str = "vs_llama_server") -> dict[str, Any]:
    header = run_header(benchmark, "edge-llm vs llama-server",
                        datetime(2026, 12, 6, 9, 0, tzinfo=UTC), MACHINE,
                        argv=[f"benchmarks/{benchmark}.py"])  # fmt: skip
    return {"run": header, "tables": [table_data("3 repeats", COLUMNS, ROWS)]}


def make_repo(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "README.md").write_text(f"# x\n\n{SUMMARY_BEGIN}\n{SUMMARY_END}\n\nend\n")
    kv_begin, kv_end = headline_markers("kv_quant")
    (tmp_path / "docs" / "benchmarks" / "index.md").write_text(
        f"# Benchmarks\n\n{HEADLINE_BEGIN}\n{HEADLINE_END}\n\n{kv_begin}\n{kv_end}\n\n"
        f"## Published runs\n\n{INDEX_BEGIN}\n{INDEX_END}\n"
    )
    return tmp_path


def test_the_headline_table_goes_to_the_benchmarks_page_with_links_from_there(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path)
    publish(document(), root=repo)
    index = (repo / "docs/benchmarks/index.md").read_text()
    part = index[index.index(HEADLINE_BEGIN) : index.index(HEADLINE_END)]
    assert "| single-stream decode | tok/s | 101 | 109 | 0.81 / 0.93 / 1.10 | >= 1.0x |" in part
    assert "From [the run of 2026-12-06](2026-12-06-vs-llama-server.md)" in part
    assert "Every published run: [docs/benchmarks](#published-runs)." in part
    assert "docs/benchmarks/" not in part
    assert "| single-stream decode |" not in (repo / "README.md").read_text()
    assert check(repo) == []


def test_the_readme_keeps_one_line_of_median_ratios(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    publish(document(), root=repo)
    readme = (repo / "README.md").read_text()
    part = readme[readme.index(SUMMARY_BEGIN) : readme.index(SUMMARY_END) + len(SUMMARY_END)]
    line = part.splitlines()[1]
    assert len(part.splitlines()) == 3
    assert line == (
        "On the embedded SmolLM2-135M Q4_1, against llama.cpp's llama-server, same GGUF "
        "and threads (median ratio edge-llm / "
        "llama-server, [the run of 2026-12-06](docs/benchmarks/2026-12-06-vs-llama-server.md)): "
        "single-stream decode 0.93 (goal >= 1.0x); 4 streams, aggregate decode 0.91 "
        "(goal >= 1.2x)."
    )
    (repo / "README.md").write_text(readme.replace("0.93 (goal", "0.99 (goal"))
    assert check(repo) == ["README.md: the generated part is stale"]


def test_the_readme_gives_the_15b_models_line_beside_the_135m_ones(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    publish(document(), root=repo)
    publish(document("vs_llama_server_qwen2_5_coder_1_5b"), root=repo)
    publish(document("vs_llama_server_deterministic"), root=repo)  # not a matrix model
    readme = (repo / "README.md").read_text()
    part = readme[readme.index(SUMMARY_BEGIN) : readme.index(SUMMARY_END)]
    lines = [line for line in part.splitlines()[1:] if line]
    assert [line.split(",")[0] for line in lines] == [
        "On the embedded SmolLM2-135M Q4_1", "On Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    ]  # fmt: skip
    assert "(docs/benchmarks/2026-12-06-vs-llama-server-qwen2-5-coder-1-5b.md)" in lines[1]
    assert check(repo) == []


def test_the_repositorys_readme_has_the_summary_and_no_headline_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert SUMMARY_BEGIN in readme
    assert "BEGIN benchmark headline" not in readme
    index = (ROOT / "docs/benchmarks/index.md").read_text(encoding="utf-8")
    assert HEADLINE_BEGIN in index
