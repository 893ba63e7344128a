"""The configured upstreams, their health, and which of them may take a request.

Health is passive and periodic: a connection error, a time-out or a 5xx marks an
upstream unhealthy at once; a GET /v1/models every ``health_interval_s`` marks it
healthy again (and learns its model ids when the config lists none).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType

from edge_llm.config.upstream import UpstreamConfig

# A health check answers within this, or the upstream counts as down.
_CHECK_TIMEOUT_S = 5.0
_MAX_MODELS_BODY = 1 << 20
# aiohttp stops reading the socket once twice this is buffered and unread.
_READ_BUFFER_BYTES = 8192


@dataclass
class Upstream:
    name: str
    config: UpstreamConfig
    healthy: bool = True
    last_error: str | None = None
    checked_at: float | None = None
    discovered_models: list[str] = field(default_factory=list)
    num_open: int = 0  # streams open to it now

    @property
    def models(self) -> list[str]:
        return self.config.models or self.discovered_models

    @property
    def has_room(self) -> bool:
        return self.num_open < self.config.max_concurrency

    def headers(self) -> dict[str, str]:
        key = self.config.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def url(self, path: str) -> str:
        return self.config.url + path

    def upstream_model(self, local_model: str) -> str:
        """The model to ask a fallback upstream for in place of the local one."""
        models = self.models
        if not models or local_model in models:
            return local_model
        return models[0]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.config.url,
            "healthy": self.healthy,
            "last_error": self.last_error,
            "models": self.models,
            "fallback": self.config.fallback,
            "open_streams": self.num_open,
            "max_concurrency": self.config.max_concurrency,
        }


HealthListener = Callable[[Upstream, bool], None]


class UpstreamRegistry:
    """Owns the HTTP client session used for every upstream request."""

    def __init__(
        self,
        configs: dict[str, UpstreamConfig],
        *,
        health_interval_s: float,
        connect_timeout_s: float,
        receive_buffer_bytes: int = 0,
        on_health_change: HealthListener | None = None,
    ) -> None:
        self.upstreams = [Upstream(name, config) for name, config in configs.items()]
        self.health_interval_s = health_interval_s
        self.connect_timeout_s = connect_timeout_s
        self.receive_buffer_bytes = receive_buffer_bytes
        self._on_health_change = on_health_change
        self._session: aiohttp.ClientSession | None = None
        self._checker: asyncio.Task[None] | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No pooling limit of its own (each upstream has max_concurrency); no proxy
            # from the environment: an upstream is addressed directly. Small receive
            # buffers (kernel and aiohttp's) so that not reading stops the upstream soon.
            factory = _socket_factory(self.receive_buffer_bytes)
            connector = aiohttp.TCPConnector(limit=0, socket_factory=factory)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, read_bufsize=_READ_BUFFER_BYTES
            )
        return self._session

    def __bool__(self) -> bool:
        return bool(self.upstreams)

    async def start(self) -> None:
        """Check every upstream once (learning model ids), then keep checking."""
        if not self.upstreams:
            return
        await self.check_all()
        self._checker = asyncio.create_task(self._check_periodically())

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        if self._session is not None:
            await self._session.close()

    # -- routing queries ---------------------------------------------------------------

    def serving(self, model: str) -> list[Upstream]:
        """Upstreams that list ``model``, in configuration order."""
        return [u for u in self.upstreams if model in u.models]

    def fallbacks(self) -> list[Upstream]:
        return [u for u in self.upstreams if u.config.fallback]

    def all_models(self) -> list[tuple[str, str]]:
        """(model id, upstream name) for every model an upstream serves."""
        seen: dict[str, str] = {}
        for upstream in self.upstreams:
            for model in upstream.models:
                seen.setdefault(model, upstream.name)
        return list(seen.items())

    @staticmethod
    def usable(candidates: Iterable[Upstream]) -> list[Upstream]:
        """Healthy ones with room first; unhealthy ones last (they may be back)."""
        with_room = [u for u in candidates if u.has_room]
        return [u for u in with_room if u.healthy] + [u for u in with_room if not u.healthy]

    # -- health ------------------------------------------------------------------------

    def mark(self, upstream: Upstream, healthy: bool, error: str | None = None) -> None:
        changed = upstream.healthy != healthy
        upstream.healthy = healthy
        upstream.last_error = error
        upstream.checked_at = time.monotonic()
        if changed and self._on_health_change is not None:
            self._on_health_change(upstream, healthy)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(u) for u in self.upstreams))

    async def check(self, upstream: Upstream) -> None:
        try:
            models = await self._fetch_models(upstream)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            self.mark(upstream, False, _describe(exc))
            return
        upstream.discovered_models = models
        self.mark(upstream, True)

    async def _fetch_models(self, upstream: Upstream) -> list[str]:
        timeout = aiohttp.ClientTimeout(total=_CHECK_TIMEOUT_S)
        async with self.session.get(
            upstream.url("/v1/models"), headers=upstream.headers(), timeout=timeout
        ) as response:
            if response.status != 200:
                raise ValueError(f"GET /v1/models answered {response.status}")
            body = await response.content.read(_MAX_MODELS_BODY)
        return model_ids(body)

    async def _check_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_all()


def model_ids(body: bytes) -> list[str]:
    """The ids of an OpenAI model list; ValueError if it is not one."""
    try:
        document = json.loads(body)
        return [str(item["id"]) for item in document["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError("GET /v1/models did not return an OpenAI model list") from exc


def _socket_factory(receive_buffer: int) -> Callable[[AddrInfoType], socket.socket]:
    def make(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, _ = addr_info
        sock = socket.socket(family=family, type=type_, proto=proto)
        if receive_buffer:  # before connect, so the TCP window is negotiated with it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        return sock

    return make


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:300]
