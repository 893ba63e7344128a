"""Imports point one way: a lower layer never imports a higher one.

The layers of ``src/edge_llm``, lowest first; a module may import its own package
and any package of a lower layer::

    edge_llm        the package's own ``__init__`` (its version)
    generated_section  a docs page's part generated from the code (its markers)
    errors          the server's error tree
    observability   event logs, metrics, blame, top (sinks and readers anyone may use)
    config          the configuration tree, with each feature's piece of it (the schemas
                    of ``[models.NAME]`` and ``[upstream.NAME]`` tables, the priority range)
    protocol        sans-I/O wire formats: requests, objects, SSE, WebSocket frames,
                    the stream events every connection is told
    engine          the inference thread and its policies
    upstream        the relay to other engines
    models          the served models: load, unload, memory budget, embeddings
    generation      a request as one typed job, sessions, dispatch to a local model or
                    an upstream, one answer-event stream
    server          aiohttp routes, runtime
    cli             the commands (may import anything)
    __main__        ``python -m edge_llm``

Beside that stack, programs that talk to a server over the network:

    client          the SDK: errors, observability, protocol only (it ships without the
                    engine's machinery and shares the wire formats, e.g. the SSE parser)
    doctor, bench   what the client may, plus the client itself

Inside ``engine`` the same rule holds between its rooms, lowest first::

    speculation     prompt-lookup drafts and their verification
    runtime         the Backend interface, llama.cpp (the one module importing it),
                    chat template, sampling, decode threads
    sequence        one request's generation
    kv              the KV books, their operations, the tiers and their ledger
    scheduling      who runs next: scheduler, priorities, admission, prefill budget
    settings        what the engine enforces
    streams         stream handles, their book, rings, text, time-outs
    pressure        offload and preemption policies, memory pressure
    step            a step's run on the backend and its output
    snapshot        the /debug/streams document
    parts           what an engine is made of
    engine          the inference thread (``engine.py``)
    build           how the parts are wired into an engine
    face            the package itself (``edge_llm.engine``)

Other rooms import the engine through its face, ``edge_llm.engine`` (``ENGINE_INSIDE``
lists the few that reach inside, each with its reason).

``KNOWN_EXCEPTIONS`` lists the imports that break the rule today, each with its
reason; an entry that no longer occurs fails too, so the list only shrinks.
Imports inside functions count as much as those at the top.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import edge_llm

SOURCE = Path(edge_llm.__file__).parent
STACK = (
    "edge_llm",
    "generated_section",
    "errors",
    "observability",
    "config",
    "protocol",
    "engine",
    "upstream",
    "models",
    "generation",
    "server",
    "cli",
    "__main__",
)
NETWORK_CLIENTS = {
    "client": {"errors", "observability", "protocol"},
    "doctor": {"errors", "observability", "protocol", "client"},
    "bench": {"errors", "observability", "protocol", "client"},
}
ENGINE_ROOMS = (
    "speculation",
    "runtime",
    "sequence",
    "kv",
    "scheduling",
    "settings",
    "streams",
    "pressure",
    "step",
    "snapshot",
    "parts",
    "engine",
    "build",
    "face",
)
# (importer, imported module): why it is allowed for now.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}
# Other rooms use the engine through its face (``edge_llm.engine``); these reach
# inside it, each with its reason (at most 3).
ENGINE_INSIDE: dict[tuple[str, str], str] = {
    ("edge_llm.server.runtime", "edge_llm.engine.runtime.llama_backend"): (
        "imported only when a model is served: it loads llama.cpp, which a fake "
        "backend's tests and the CLI's help never need"
    ),
    ("edge_llm.models.sizing", "edge_llm.engine.runtime.llama_backend"): (
        "the embedded model's path, asked only when sizing it: loads llama.cpp as above"
    ),
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "edge_llm"


def engine_room_of(module: str) -> str | None:
    """The room inside ``engine`` (a subpackage or a top module); None outside it."""
    parts = module.split(".")
    if parts[1:2] != ["engine"]:
        return None
    return parts[2] if len(parts) > 2 else "face"


def may_import(importer: str, imported: str) -> bool:
    if importer == imported:
        return True
    if importer in NETWORK_CLIENTS:
        return imported in NETWORK_CLIENTS[importer]
    if importer in ("cli", "__main__"):
        return True
    return imported in STACK[: STACK.index(importer)]


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> Iterator[str]:
    """Every ``edge_llm`` module ``path`` imports (``from pkg import mod`` names ``pkg.mod``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("edge_llm"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("edge_llm"):
                continue
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (SOURCE.parent / candidate.replace(".", "/")).with_suffix(".py")
                yield candidate if is_module.exists() else node.module


def all_imports() -> list[tuple[str, str]]:
    pairs = []
    for path in sorted(SOURCE.rglob("*.py")):
        importer = module_name(path)
        pairs += [(importer, imported) for imported in sorted(set(imports_of(path)))]
    return pairs


def test_every_package_is_placed_in_a_layer() -> None:
    placed = {*STACK, *NETWORK_CLIENTS}
    packages = {layer_of(module_name(path)) for path in SOURCE.rglob("*.py")}
    assert packages <= placed, f"not in any layer: {sorted(packages - placed)}"


def test_no_import_points_up() -> None:
    upward = [
        f"{importer} ({layer_of(importer)}) imports {imported} ({layer_of(imported)})"
        for importer, imported in all_imports()
        if not may_import(layer_of(importer), layer_of(imported))
        and (importer, imported) not in KNOWN_EXCEPTIONS
    ]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_known_exceptions_still_occur() -> None:
    stale = set(KNOWN_EXCEPTIONS) - set(all_imports())
    assert not stale, f"no longer imported, remove from KNOWN_EXCEPTIONS: {sorted(stale)}"


def test_the_rule_catches_an_upward_import() -> None:
    assert not may_import("upstream", "server")
    assert not may_import("engine", "server")
    assert not may_import("protocol", "engine")
    assert not may_import("client", "server")
    assert not may_import("client", "engine")
    assert may_import("server", "upstream")
    assert may_import("bench", "client")


def test_every_engine_room_is_placed() -> None:
    rooms = {engine_room_of(module_name(path)) for path in (SOURCE / "engine").rglob("*.py")}
    assert rooms == set(ENGINE_ROOMS), f"placed and found differ: {rooms ^ set(ENGINE_ROOMS)}"


def test_no_import_inside_the_engine_points_up() -> None:
    upward = []
    for importer, imported in all_imports():
        low, high = engine_room_of(imported), engine_room_of(importer)
        if low is None or high is None or low == high:
            continue
        if ENGINE_ROOMS.index(low) > ENGINE_ROOMS.index(high):
            upward.append(f"{importer} ({high}) imports {imported} ({low})")
    assert not upward, "imports against the engine's rooms:\n" + "\n".join(upward)


def test_the_engine_rooms_rule_reads_rooms() -> None:
    assert engine_room_of("edge_llm.engine.kv.slots") == "kv"
    assert engine_room_of("edge_llm.engine.engine") == "engine"
    assert engine_room_of("edge_llm.engine") == "face"
    assert engine_room_of("edge_llm.models.pool") is None


def test_the_relay_keeps_the_stream_rules_not_the_engines() -> None:
    """A relayed stream keeps the same rules as a local one (``protocol/stream_rules``)
    without the engine's inner modules."""
    found = [
        f"{importer} imports {imported}"
        for importer, imported in all_imports()
        if layer_of(importer) == "upstream" and layer_of(imported) == "engine"
    ]
    assert not found, "upstream imports the engine:\n" + "\n".join(found)


def test_other_rooms_use_the_engines_face() -> None:
    inside = [
        (importer, imported)
        for importer, imported in all_imports()
        if layer_of(importer) != "engine" and imported.startswith("edge_llm.engine.")
    ]
    unexplained = [f"{a} imports {b}" for a, b in inside if (a, b) not in ENGINE_INSIDE]
    assert not unexplained, "import from edge_llm.engine instead:\n" + "\n".join(unexplained)
    assert set(ENGINE_INSIDE) <= set(inside), "stale ENGINE_INSIDE entries"
    assert len(ENGINE_INSIDE) <= 3
