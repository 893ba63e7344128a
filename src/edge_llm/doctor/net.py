"""Reachability of the server and of a configured proxy: DNS, then TCP.

Each failure is classified (DNS failure, connection refused, timeout, other OS
error) so the fix can be specific. No proxy variable is honoured here: the
direct checks must not depend on a proxy, which is probed on its own.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from edge_llm.doctor.result import CheckResult, failed, passed

_DEFAULT_PORTS = {"http": 80, "https": 443, "socks4": 1080, "socks5": 1080, "socks5h": 1080}


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class ConnectFailure:
    kind: str  # "dns", "refused", "timeout", "unreachable"
    message: str


def endpoint_of(url: str) -> Endpoint | None:
    """Host and port of an http(s)/socks URL (default port by scheme)."""
    parts = urlsplit(url if "://" in url else "http://" + url)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return Endpoint(parts.hostname, port)


def classify(exc: BaseException, where: Endpoint, timeout_s: float) -> ConnectFailure:
    """Name the cause of a failed connection attempt."""
    if isinstance(exc, socket.gaierror):
        return ConnectFailure("dns", f"DNS lookup of {where.host!r} failed ({exc.strerror})")
    if isinstance(exc, TimeoutError):
        return ConnectFailure("timeout", f"no answer from {where} within {timeout_s:g} s")
    if isinstance(exc, ConnectionRefusedError):
        return ConnectFailure("refused", f"connection to {where} refused: nothing listens there")
    if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return ConnectFailure("unreachable", f"{where} is unreachable ({exc.strerror})")
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
    return ConnectFailure("unreachable", f"cannot connect to {where}: {detail}")


async def connect(where: Endpoint, timeout_s: float) -> ConnectFailure | None:
    """Resolve and open (then close) a TCP connection; None when it worked."""
    try:
        async with asyncio.timeout(timeout_s):
            loop = asyncio.get_running_loop()
            await loop.getaddrinfo(where.host, where.port, type=socket.SOCK_STREAM)
            _, writer = await asyncio.open_connection(where.host, where.port)
            writer.close()
            await writer.wait_closed()
    except (OSError, TimeoutError) as exc:
        return classify(exc, where, timeout_s)
    return None


_REACH_FIXES = {
    "dns": "check the host name in {setting}; for an engine on this machine use 127.0.0.1",
    "refused": "start the engine (edge-llm serve) or correct the port in {setting}",
    "timeout": "check the host and port in {setting}, and that no firewall drops the connection",
    "unreachable": "check the host in {setting} and this machine's network",
}


async def check_reachable(base_url: str, timeout_s: float, setting: str) -> CheckResult:
    """Can a TCP connection be opened? ``setting`` names what sets the base URL,
    for the fix."""
    where = endpoint_of(base_url)
    if where is None:
        fix = _REACH_FIXES["dns"].format(setting=setting)
        return failed("reachable", f"no host/port in {base_url}", fix)
    failure = await connect(where, timeout_s)
    if failure is None:
        return passed("reachable", f"{where} accepts connections (direct, no proxy)")
    summary = f"{base_url}: {failure.message}"
    fix = _REACH_FIXES[failure.kind].format(setting=setting)
    return failed("reachable", summary, fix, kind=failure.kind)
