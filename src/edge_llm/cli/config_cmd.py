"""``edge-llm config TOOL``: the settings that point a coding tool at this engine.

Tools and what they get:

- ``claude-code``: the ``env`` block of ``~/.claude/settings.json``
  (``$CLAUDE_CONFIG_DIR/settings.json`` when set): ``ANTHROPIC_BASE_URL`` (the
  server root: no ``/v1``, no trailing slash; Claude Code appends
  ``/v1/messages``), ``ANTHROPIC_API_KEY``, ``ANTHROPIC_MODEL``, the same model
  for its background tasks (``ANTHROPIC_DEFAULT_HAIKU_MODEL``: titles, summaries),
  and ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (no telemetry or update
  checks leave the machine). A note says what fits a small model's context.
- ``cline``: its "OpenAI Compatible" provider settings: base URL with ``/v1``,
  key, model id (as Cline's state keys). No default file: ``--write`` needs ``--path``.
- ``codex``: ``~/.codex/config.toml`` (``$CODEX_HOME/config.toml``): top-level
  ``model`` and ``model_provider``, and a ``[model_providers.edge-llm]`` table
  (``base_url`` with ``/v1``, ``env_key = "EDGE_LLM_API_KEY"``,
  ``wire_api = "responses"``: Codex no longer accepts ``"chat"``). The key itself
  stays in the environment variable; comments give the ``-c`` overrides that
  shrink Codex's prompt for a small model.
- ``openai-env``: shell exports ``OPENAI_BASE_URL`` (with ``/v1``),
  ``OPENAI_API_KEY``, ``OPENAI_MODEL``. ``--write`` needs ``--path``.

Values: ``--base-url`` and ``--api-key`` as every command resolves them
(:mod:`edge_llm.client.address`: the flag, ``EDGE_LLM_BASE_URL`` /
``EDGE_LLM_API_KEY``, ``OPENAI_*``, else ``http://127.0.0.1:8000`` and
``sk-local``, which any engine started without ``--api-key`` accepts), ``--model``
(default: the first id of ``GET /v1/models``; an engine that does not answer
within 2 s is an error that says so, unless ``--model`` is given).

Without ``--write`` the snippet goes to stdout (notes to stderr). With
``--write`` the settings are merged into the file (other keys, tables and
comments are kept), the diff is shown, and the previous file is kept as
``FILE.bak``. Exit codes: 0 done, 1 the engine cannot tell the model id or the
file cannot be merged or written, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_llm.client.address import ServerAddress, add_address_flags, resolve_address
from edge_llm.client.errors import ConfigError

TOOLS = ("claude-code", "cline", "codex", "openai-env")
PROVIDER = "edge-llm"
CODEX_KEY_ENV = "EDGE_LLM_API_KEY"
MODEL_PROBE_TIMEOUT_S = 2.0
MAX_MODELS_BODY = 64 * 1024
_HEADER = re.compile(r"^\s*\[\[?\s*(?P<name>[^\]]+?)\s*\]\]?\s*(#.*)?$")


class MergeError(Exception):
    """The existing file cannot be merged into without risk (invalid, or an
    unexpected shape); nothing was written."""


class NoModelId(Exception):
    """The engine did not tell its model id; the message says why and what to do."""


@dataclass(frozen=True)
class Target:
    root: str  # http://host:port[/prefix], no /v1, no trailing slash
    api_key: str
    model: str

    @property
    def v1(self) -> str:
        return self.root + "/v1"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "config",
        help="print (or merge into a file) the settings pointing a tool at this engine",
        description="Print the settings that point claude-code, cline, codex or "
        "OpenAI-style tools (openai-env) at this engine; --write merges them into the "
        "tool's file after showing a diff, keeping FILE.bak.",
    )
    parser.add_argument("tool", choices=TOOLS)
    add_address_flags(parser)
    parser.add_argument("--model", help="model id (default: asked from the engine)")
    parser.add_argument("--write", action="store_true", help="merge into the tool's file")
    parser.add_argument("--path", help="file to write instead of the tool's default")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        address = resolve_address(base_url=args.base_url, api_key=args.api_key, env=os.environ)
    except ConfigError as exc:
        return _usage_error(str(exc))
    try:
        model = args.model or served_model(address)
    except NoModelId as exc:
        print(f"edge-llm config: {exc}", file=sys.stderr)
        return 1
    target = Target(address.root, address.api_key, model)
    tool = TOOLS_BY_NAME[args.tool]
    if not args.write:
        print(tool.render(target), end="")
        _note(f"# {tool.where(args.path, os.environ)}")
        _note(tool.note)
        return 0
    path = args.path or tool.default_path(os.environ)
    if path is None:
        return _usage_error(f"--write for {args.tool} needs --path FILE (it has no standard file)")
    code = write_merged(Path(path).expanduser(), tool, target)
    if code == 0 and args.tool == "codex":
        _note(f"# Codex reads the key from the environment: export {CODEX_KEY_ENV}=...")
    if code == 0:
        _note(tool.note)
    return code


def served_model(address: ServerAddress) -> str:
    """The engine's first model id. Raises :class:`NoModelId` (one line: the URL,
    why, and what to change) when the engine does not answer with one."""
    url = address.base_url + "/models"
    request = urllib.request.Request(url, headers=address.headers())
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=MODEL_PROBE_TIMEOUT_S) as response:
            data = json.loads(response.read(MAX_MODELS_BODY))
        model = str(data["data"][0]["id"])
    except urllib.error.HTTPError as exc:
        hint = " (wrong --api-key / EDGE_LLM_API_KEY?)" if exc.code in (401, 403) else ""
        raise NoModelId(f"GET {url} answered HTTP {exc.code}{hint}; or pass --model") from exc
    except OSError as exc:
        raise NoModelId(f"{address.unreachable(exc)}; or pass --model") from exc
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise NoModelId(f"GET {url} listed no model id; pass --model") from exc
    _note(f"# model id {model!r} from {url}")
    return model


# -- what each tool gets -----------------------------------------------------------------


def claude_code_settings(target: Target) -> dict[str, Any]:
    return {
        "env": {
            "ANTHROPIC_BASE_URL": target.root,
            "ANTHROPIC_API_KEY": target.api_key,
            "ANTHROPIC_MODEL": target.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": target.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
    }


# Measured with the CLIs' captured requests (tests/data/agents), SmolLM2's tokenizer.
CLAUDE_CODE_NOTE = """\
# Claude Code's default prompt (system prompt + 24 tools) is ~20,000 tokens: more
# than a small model's context (SmolLM2-135M: 8,192) and than the engine's
# max_prompt_tokens (512 by default): it gets 400 prompt_too_long. On a small model
# use print mode without tools (a few hundred tokens, within the default limit):
#   claude -p "question" --bare --tools "" --system-prompt "You are a helpful assistant."
# Agent work with tools needs a bigger model (serve --model X.gguf --max-prompt-tokens N).
"""

CODEX_NOTE = """\
# Codex's default prompt (~10,000 tokens) does not fit a small model's context; for
# SmolLM2-135M shrink it (docs/agents.md):
#   codex exec --skip-git-repo-check -c model_instructions_file=short.md \\
#     -c features.shell_tool=false \\
#     -c web_search=disabled -c skills.include_instructions=false \\
#     -c include_environment_context=false -c include_permissions_instructions=false \\
#     -c features.multi_agent=false -c features.goals=false "question"
"""


def cline_settings(target: Target) -> dict[str, Any]:
    return {
        "actModeApiProvider": "openai",
        "planModeApiProvider": "openai",
        "openAiBaseUrl": target.v1,
        "openAiApiKey": target.api_key,
        "actModeOpenAiModelId": target.model,
        "planModeOpenAiModelId": target.model,
    }


def codex_top_level(target: Target) -> dict[str, str]:
    return {"model": target.model, "model_provider": PROVIDER}


def codex_provider(target: Target) -> dict[str, str]:
    return {
        "name": PROVIDER,
        "base_url": target.v1,
        "env_key": CODEX_KEY_ENV,
        "wire_api": "responses",
    }


def openai_exports(target: Target) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": target.v1,
        "OPENAI_API_KEY": target.api_key,
        "OPENAI_MODEL": target.model,
    }


def _json_text(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def codex_snippet(target: Target) -> str:
    top = "".join(f"{k} = {_toml_str(v)}\n" for k, v in codex_top_level(target).items())
    return (
        f"{top}\n{_toml_table(codex_provider(target))}"
        f"# Codex reads the key from the environment:\n"
        f"# export {CODEX_KEY_ENV}={shlex.quote(target.api_key)}\n"
    )


def exports_text(target: Target) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in openai_exports(target).items())


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's


def _toml_table(values: Mapping[str, str]) -> str:
    body = "".join(f"{k} = {_toml_str(v)}\n" for k, v in values.items())
    return f"[model_providers.{PROVIDER}]\n{body}"


# -- merging into existing files -----------------------------------------------------------


def merge_json(old: str, patch: Mapping[str, Any]) -> str:
    """Set ``patch``'s keys (one level of nested objects merged) keeping all others."""
    data = _json_object(old)
    for key, value in patch.items():
        if isinstance(value, dict):
            current = data.setdefault(key, {})
            if not isinstance(current, dict):
                raise MergeError(f"{key!r} in the file is not an object")
            current.update(value)
        else:
            data[key] = value
    return _json_text(data)


def _json_object(old: str) -> dict[str, Any]:
    if not old.strip():
        return {}
    try:
        data = json.loads(old)
    except json.JSONDecodeError as exc:
        raise MergeError(f"the file is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise MergeError("the file is not a JSON object")
    return data


def merge_codex(old: str, target: Target) -> str:
    """Set the top-level keys and replace the provider table in place (or add it
    at the end), keeping the rest of the file, comments included, as it was."""
    _toml_document(old)
    lines = old.splitlines()
    first = next((i for i, line in enumerate(lines) if _HEADER.match(line)), len(lines))
    top = _set_top_level(lines[:first], codex_top_level(target))
    if first < len(lines) and top[-1].strip():
        top.append("")  # a blank line before the first table
    rest, at = _drop_table(lines[first:], f"model_providers.{PROVIDER}")
    table = _toml_table(codex_provider(target)).splitlines()
    if at is None:
        rest = [*_without_trailing_blanks(rest), *([""] if top or rest else []), *table]
    else:
        rest[at:at] = table
    merged = "\n".join(_without_trailing_blanks(top + rest)) + "\n"
    _verify_codex(merged, target)
    return merged


def _toml_document(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MergeError(f"the file is not valid TOML ({exc})") from exc


def _set_top_level(lines: list[str], values: Mapping[str, str]) -> list[str]:
    """Replace ``key = ...`` lines; add missing keys after the last one replaced
    (or after the preamble's content)."""
    result = list(lines)
    anchor: int | None = None
    missing = []
    for key, value in values.items():
        pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
        index = next((i for i, line in enumerate(result) if pattern.match(line)), None)
        if index is None:
            missing.append(f"{key} = {_toml_str(value)}")
        else:
            result[index] = f"{key} = {_toml_str(value)}"
            anchor = index if anchor is None else max(anchor, index)
    at = anchor + 1 if anchor is not None else len(_without_trailing_blanks(result))
    result[at:at] = missing
    return result


def _drop_table(lines: list[str], name: str) -> tuple[list[str], int | None]:
    """Remove ``[name]`` up to the next table header (comments just before that
    header stay: they describe it); also return where it was."""
    start = next((i for i, line in enumerate(lines) if _table_name(line) == name), None)
    if start is None:
        return lines, None
    end = next((i for i in range(start + 1, len(lines)) if _HEADER.match(lines[i])), len(lines))
    keep_from = end
    while keep_from > start + 1 and lines[keep_from - 1].lstrip().startswith("#"):
        keep_from -= 1
    kept_blank = keep_from > start + 1 and not lines[keep_from - 1].strip()
    return lines[:start] + ([""] if kept_blank else []) + lines[keep_from:], start


def _without_trailing_blanks(lines: list[str]) -> list[str]:
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines[:end]


def _table_name(line: str) -> str | None:
    match = _HEADER.match(line)
    if match is None:
        return None
    return ".".join(part.strip().strip("\"'") for part in match["name"].split("."))


def _verify_codex(merged: str, target: Target) -> None:
    try:
        document = tomllib.loads(merged)
    except tomllib.TOMLDecodeError as exc:
        raise MergeError(
            f"the file defines model_providers in a form this command cannot extend ({exc})"
        ) from exc
    top = {key: document.get(key) for key in codex_top_level(target)}
    providers = document.get("model_providers")
    provider = providers.get(PROVIDER) if isinstance(providers, dict) else None
    if top != codex_top_level(target) or provider != codex_provider(target):
        raise MergeError("the file defines these keys in a form this command cannot update")


def merge_exports(old: str, target: Target) -> str:
    """Replace ``[export] NAME=...`` lines of our variables, append the others."""
    values = openai_exports(target)
    lines = old.splitlines()
    for name, value in list(values.items()):
        pattern = re.compile(rf"^\s*(export\s+)?{name}=")
        index = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
        if index is not None:
            lines[index] = f"export {name}={shlex.quote(value)}"
            del values[name]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


# -- the tools -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    render: Callable[[Target], str]
    merge: Callable[[str, Target], str]
    default_path: Callable[[Mapping[str, str]], str | None]
    file_hint: str
    note: str = ""  # what else the user should know (printed to stderr)

    def where(self, path: str | None, env: Mapping[str, str]) -> str:
        where = path or self.default_path(env)
        if where is None:
            return f"{self.file_hint}; or use --write --path FILE"
        return f"{self.file_hint}: {where} (--write merges it there, keeping a .bak)"


def _claude_path(env: Mapping[str, str]) -> str:
    base = env.get("CLAUDE_CONFIG_DIR") or str(Path.home() / ".claude")
    return str(Path(base) / "settings.json")


def _codex_path(env: Mapping[str, str]) -> str:
    base = env.get("CODEX_HOME") or str(Path.home() / ".codex")
    return str(Path(base) / "config.toml")


def _no_path(env: Mapping[str, str]) -> str | None:
    return None


TOOLS_BY_NAME = {
    "claude-code": Tool(
        render=lambda t: _json_text(claude_code_settings(t)),
        merge=lambda old, t: merge_json(old, claude_code_settings(t)),
        default_path=_claude_path,
        file_hint="merge into the env block of Claude Code's settings.json",
        note=CLAUDE_CODE_NOTE,
    ),
    "cline": Tool(
        render=lambda t: _json_text(cline_settings(t)),
        merge=lambda old, t: merge_json(old, cline_settings(t)),
        default_path=_no_path,
        file_hint="in Cline: Settings > API Provider 'OpenAI Compatible', Base URL, API Key, "
        "Model ID (these are its state keys)",
    ),
    "codex": Tool(
        render=codex_snippet,
        merge=merge_codex,
        default_path=_codex_path,
        file_hint="merge into Codex's config.toml and export the key variable",
        note=CODEX_NOTE,
    ),
    "openai-env": Tool(
        render=exports_text,
        merge=merge_exports,
        default_path=_no_path,
        file_hint="paste into your shell or a file you source",
    ),
}


# -- writing -------------------------------------------------------------------------------


def write_merged(path: Path, tool: Tool, target: Target) -> int:
    try:
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        new = tool.merge(old, target)
    except (OSError, MergeError) as exc:
        print(f"edge-llm config: cannot merge into {path}: {exc}", file=sys.stderr)
        print(f"edge-llm config: nothing written; add this by hand:\n{tool.render(target)}")
        return 1
    if new == old:
        print(f"{path} is already up to date")
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), str(path), str(path)
        )
    )
    try:
        backup = _replace(path, old if path.exists() else None, new)
    except OSError as exc:
        print(f"edge-llm config: cannot write {path}: {exc}", file=sys.stderr)
        return 1
    kept = f" (previous version: {backup})" if backup else ""
    print(f"wrote {path}{kept}")
    return 0


def _replace(path: Path, old: str | None, new: str) -> Path | None:
    """Keep ``path.bak``, then swap the new content in atomically; a new file is
    private (0600): it holds a key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    mode = 0o600
    if old is not None:
        mode = path.stat().st_mode & 0o777
        backup = path.with_name(path.name + ".bak")
        backup.write_text(old, encoding="utf-8")
        os.chmod(backup, mode)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(new)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return backup


def _note(message: str) -> None:
    if message:
        print(message.rstrip("\n"), file=sys.stderr)


def _usage_error(message: str) -> int:
    print(f"edge-llm config: {message}", file=sys.stderr)
    return 2
