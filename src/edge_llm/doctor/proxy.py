"""Proxy variables: which one applies to the base URL, and does that proxy work?

A dead local proxy named in ``HTTPS_PROXY`` (or ``http_proxy``, ``ALL_PROXY``...)
breaks every tool that honours proxy variables ("local proxy failed") while a
direct connection works. The fix is to bypass the proxy for the engine's host
(``NO_PROXY``) or unset the variable, never to add another proxy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from edge_llm.doctor.net import Endpoint, connect, endpoint_of
from edge_llm.doctor.result import CheckResult, failed, passed, warned

PROXY_VARIABLES = (
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
)
_PROXY_BROKEN_STATUSES = frozenset({407, 502, 503, 504})


@dataclass(frozen=True)
class ProxyChoice:
    variable: str
    url: str


def proxy_variables(env: Mapping[str, str]) -> dict[str, str]:
    """Every proxy variable that is set (upper and lower case)."""
    return {name: env[name] for name in PROXY_VARIABLES if env.get(name)}


def proxy_for(url: str, env: Mapping[str, str]) -> ProxyChoice | None:
    """The variable a typical client uses for ``url`` (lower case first), if any."""
    scheme = urlsplit(url).scheme
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"):
        if env.get(name):
            return ProxyChoice(name, env[name].strip())
    return None


def bypass_variable(url: str, env: Mapping[str, str]) -> str | None:
    """The NO_PROXY variable that exempts ``url``'s host, if one does."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    for name in ("no_proxy", "NO_PROXY"):
        entries = [e.strip().lower() for e in env.get(name, "").split(",") if e.strip()]
        if any(_exempts(entry, host, parts.port) for entry in entries):
            return name
    return None


def _exempts(entry: str, host: str, port: int | None) -> bool:
    """One NO_PROXY entry: ``*``, a host or domain suffix (``.lan``), ``host:port``,
    or an address range (``127.0.0.0/8``)."""
    if entry == "*":
        return True
    name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
    if entry_port and entry_port != str(port):
        return False
    if "/" in name:
        return _in_network(host, name)
    name = name.lstrip(".").strip("[]")
    return host == name or host.endswith("." + name)


def _in_network(host: str, network: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False


def bypass_fix(base_url: str, env: Mapping[str, str]) -> str:
    host = urlsplit(base_url).hostname or "127.0.0.1"
    hosts = ",".join(dict.fromkeys([host, "localhost", "127.0.0.1"]))
    names = " ".join(n for n in PROXY_VARIABLES if "no_" not in n.lower() and env.get(n))
    return (
        f"bypass the proxy for the engine: export NO_PROXY={hosts} no_proxy={hosts} "
        f"(or unset {names}); do not add a proxy setting, the engine is reached directly"
    )


async def check_proxy(base_url: str, env: Mapping[str, str], timeout_s: float) -> CheckResult:
    found = proxy_variables(env)
    choice = proxy_for(base_url, env)
    if choice is None:
        names = ", ".join(found) or "none"
        return passed("proxy", f"no proxy variable applies to {base_url} (set: {names})")
    bypass = bypass_variable(base_url, env)
    if bypass is not None:
        summary = f"{choice.variable}={choice.url} is set, but {bypass} exempts this host"
        return passed("proxy", summary, variables=found)
    return await _probe(base_url, choice, env, timeout_s, found)


async def _probe(
    base_url: str,
    choice: ProxyChoice,
    env: Mapping[str, str],
    timeout_s: float,
    found: dict[str, str],
) -> CheckResult:
    where = endpoint_of(choice.url)
    label = f"{choice.variable}={choice.url}"
    if where is None:
        summary = f"{label} is not a proxy URL"
        return failed("proxy", summary, bypass_fix(base_url, env), variables=found)
    failure = await connect(where, timeout_s)
    if failure is not None:
        prefix = "local proxy failed" if _is_local(where) else "proxy failed"
        summary = f"{prefix}: {label}: {failure.message}"
        return failed(
            "proxy", summary, bypass_fix(base_url, env), variables=found, kind=failure.kind
        )
    if urlsplit(choice.url).scheme not in ("http", "https"):
        summary = f"{label} accepts connections; requests through a SOCKS proxy are not tested"
        return warned("proxy", summary, bypass_fix(base_url, env), variables=found)
    return await _through_proxy(base_url, choice, env, timeout_s, found)


async def _through_proxy(
    base_url: str,
    choice: ProxyChoice,
    env: Mapping[str, str],
    timeout_s: float,
    found: dict[str, str],
) -> CheckResult:
    label = f"{choice.variable}={choice.url}"
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(trust_env=False, timeout=timeout) as session,
            session.get(base_url + "/models", proxy=choice.url) as response,
        ):
            status = response.status
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        summary = f"proxy {label} accepts connections but the request through it failed: {exc!r}"
        return failed("proxy", summary, bypass_fix(base_url, env), variables=found)
    if status in _PROXY_BROKEN_STATUSES:
        summary = f"proxy {label} cannot reach {base_url} (HTTP {status} from the proxy)"
        return failed("proxy", summary, bypass_fix(base_url, env), variables=found, status=status)
    summary = f"requests through {label} reach the server (HTTP {status})"
    return passed("proxy", summary, variables=found, status=status)


def _is_local(where: Endpoint) -> bool:
    if where.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(where.host).is_loopback
    except ValueError:
        return False
