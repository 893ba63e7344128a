"""One entry for every route: who answers a request, and the answer as one event stream.

:meth:`Dispatcher.start` asks the router which backend takes the request (the
upstreams serving the model it names, else the local engine) and starts it
there. When the device refuses a request for its own model (``prompt_too_long``,
``queue_full``, ``kv_budget_exceeded``), an upstream with ``fallback = true``
takes it if one can; a request that cannot be relayed (an Anthropic prefill)
keeps the refusal, which says more than ``upstream_unavailable``.

A local request first leases the model it names from the
:class:`~edge_llm.models.pool.ModelPool` (loading it if needed); the lease is
held until the answer is closed, so a model is never unloaded under a request.

Whoever answers, the route gets an :class:`Answer`: one answer-event stream
(:mod:`edge_llm.generation.events`: text and tool-call events, heartbeats, the
end), the ids and headers to send, usage and stats, and pause / resume / cancel.
Used as a context manager it is closed however the handler ends: a local stream still running is
cancelled (reason ``disconnect``) and frees its KV, a relayed one closes its
upstream connection. A route reads parse → job → encode.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from edge_llm.engine import StreamHandle
from edge_llm.errors import EdgeLLMError, InvalidRequest
from edge_llm.generation.answer import Answer
from edge_llm.generation.events import AnswerEvent, ChunkReader, EngineReader, answer_events
from edge_llm.generation.job import GenerationJob, Relay
from edge_llm.generation.pending import PendingAnswer
from edge_llm.generation.pump import PumpSettings, pump, read_relayed
from edge_llm.generation.service import GenerationService, ServedModel, response_headers
from edge_llm.generation.sessions import Sessions
from edge_llm.models.pool import Lease, ModelPool
from edge_llm.models.pulling import PullFlight
from edge_llm.protocol.stream_events import Ending
from edge_llm.protocol.stream_rules import PauseCause
from edge_llm.protocol.tools import ToolSetup
from edge_llm.upstream.registry import Upstream
from edge_llm.upstream.router import FALLBACK_ERRORS, LOCAL, UpstreamRouter
from edge_llm.upstream.stream import UpstreamStream

# Answer is defined apart (the pending answer needs it too); the routes import it here.
__all__ = ["Answer", "Dispatcher", "LocalAnswer", "RelayedAnswer"]


class LocalAnswer(Answer):
    def __init__(
        self,
        lease: Lease[ServedModel],
        handle: StreamHandle,
        settings: PumpSettings,
        sessions: Sessions,
        *,
        tools: ToolSetup | None = None,
        progress: bool = False,
    ) -> None:
        self.lease = lease
        self.sessions = sessions
        self.tools = tools
        self.service = lease.model.service
        self.engine = lease.model.engine
        self.handle = handle
        self.settings = settings
        self.progress = progress
        self.id = handle.id
        self.model = lease.name
        self.n_prompt = handle.seq.n_prompt
        self.headers = response_headers(handle)

    @property
    def backend(self) -> str:
        return LOCAL

    @property
    def token_bytes(self) -> Callable[[int], bytes] | None:
        return self.service.backend.token_bytes

    @property
    def outcome(self) -> Ending | None:
        return self.handle.outcome

    @property
    def finished(self) -> bool:
        return self.handle.finished

    def events(self, new_id: Callable[[], str]) -> AsyncIterator[AnswerEvent]:
        source = pump(self.engine, self.handle, self.settings, progress=self.progress)
        return answer_events(source, EngineReader.of(self.tools, new_id), self.usage)

    @property
    def text_only(self) -> bool:
        return self.tools is None or not self.tools.active

    def usage(self) -> dict[str, Any]:
        return self.handle.usage()

    def stats(self) -> dict[str, Any]:
        return self.handle.stats(self.engine.clock())

    def pause(self) -> None:
        self.engine.pause(self.handle, PauseCause.CLIENT)

    def resume(self) -> None:
        self.engine.resume(self.handle, PauseCause.CLIENT)

    def cancel(self, reason: str) -> None:
        self.engine.cancel(self.handle, reason)

    def detach(self) -> None:
        self.engine.pause(self.handle, PauseCause.DISCONNECTED)

    def reattach(self, **detail: Any) -> None:
        self.engine.resume(self.handle, PauseCause.DISCONNECTED, **detail)

    def close(self) -> None:
        if not self.handle.finished:
            self.engine.cancel(self.handle, "disconnect")
        self.sessions.ended(self.handle.seq.session, self)
        self.lease.release()


class RelayedAnswer(Answer):
    def __init__(self, router: UpstreamRouter, stream: UpstreamStream, sessions: Sessions) -> None:
        self.router = router
        self.sessions = sessions
        self.stream = stream
        self.id = stream.id
        self.model = stream.client_model
        self.n_prompt = 0
        self.headers = {"X-Request-Id": stream.id}
        self._closed = False

    @property
    def backend(self) -> str:
        return self.stream.relay.backend  # the next candidate's after a failover

    @property
    def outcome(self) -> Ending | None:
        return self.stream.relay.outcome

    def events(self, new_id: Callable[[], str]) -> AsyncIterator[AnswerEvent]:
        return answer_events(read_relayed(self.stream), ChunkReader.of(new_id), self.usage)

    def usage(self) -> dict[str, Any]:
        return self.stream.relay.usage()

    def stats(self) -> dict[str, Any]:
        return self.stream.relay.stats(time.monotonic())

    def pause(self) -> None:
        self.stream.pause()

    def resume(self) -> None:
        self.stream.resume()

    def cancel(self, reason: str) -> None:
        self.stream.cancel(reason)

    def detach(self) -> None:
        self.stream.pause()  # the upstream is not read while detached

    def reattach(self, **detail: Any) -> None:
        self.stream.resume()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.router.closed(self.stream)
            self.sessions.ended(self.stream.session, self)


class Dispatcher:
    def __init__(
        self,
        pool: ModelPool[ServedModel],
        router: UpstreamRouter,
        settings: PumpSettings,
        sessions: Sessions,
    ) -> None:
        self.pool = pool
        self.router = router
        self.settings = settings
        self.sessions = sessions

    async def start(self, job: GenerationJob) -> Answer:
        """The answer to ``job``, started where the router sends it; raises the
        error the client must get (a refusal no upstream takes, a bad request). A
        streamed job whose model is pulled on first use gets its answer at once,
        waiting in the stream (:mod:`edge_llm.generation.pending`)."""
        model = job.model
        if model is not None and not self.router.registry.serving(model):
            # pulled since the start, or now; any spelling of it is its served name
            served = self.pool.served_name(model)
            if served is None and job.streamed and (flight := self.pool.pulling(model)):
                return self._pending(job, flight)
            model = served or await self.pool.discover_or_pull(model) or model
        return await self._start_on(job, model)

    def _pending(self, job: GenerationJob, flight: PullFlight) -> Answer:
        request_id = "chatcmpl-" + uuid.uuid4().hex[:24]  # the engine's form: no engine yet
        job = replace(job, request_id=request_id)
        return PendingAnswer(
            flight, self.pool.pulled, lambda model: self._start_on(job, model),
            request_id=request_id, progress=job.progress,
            heartbeat_interval_s=self.settings.heartbeat_interval_s,
        )  # fmt: skip

    async def _start_on(self, job: GenerationJob, model: str | None) -> Answer:
        """``job``'s answer on ``model`` (a served name, an upstream's, or None)."""
        upstreams = self.router.upstreams_for(model, any_model_local=job.any_model_runs_locally)
        if upstreams is not None:
            return self._relay(job, job.relayed(), upstreams, route="model")
        name = self.local_name(job)
        lease = await self.pool.acquire(name)
        try:
            handle, tools = await self._submit(job, lease.model.service)
        except FALLBACK_ERRORS as refused:
            lease.release()
            return self._fall_back(job, refused, name)
        except BaseException:
            lease.release()
            raise
        self.router.count_local()
        answer = LocalAnswer(
            lease, handle, self.settings, self.sessions, tools=tools, progress=job.progress
        )
        self.sessions.started(job.session, answer)
        return answer

    async def _submit(
        self, job: GenerationJob, service: GenerationService
    ) -> tuple[StreamHandle, ToolSetup | None]:
        """Prepare ``job``, end its session's live stream, submit it."""
        prepared = await service.prepare(job)
        self.sessions.starting(job.session)
        return service.submit(prepared), prepared.tools

    def local_name(self, job: GenerationJob) -> str:
        """The local model that runs ``job`` (Anthropic's unknown ids: the default)."""
        if job.any_model_runs_locally and not self.pool.discover(job.model):
            return self.pool.default
        return self.pool.resolve(job.model)

    def _fall_back(self, job: GenerationJob, refused: EdgeLLMError, served: str) -> Answer:
        """An upstream takes what the device's model ``served`` refused; the answer
        names that model, as a local one would (not the name the request spelt)."""
        candidates = self.router.fallback_for(refused)
        if not candidates:
            raise refused
        try:
            relay = job.relayed()
        except InvalidRequest:
            raise refused from None  # it cannot be relayed: the device's refusal stands
        relay = replace(relay, body={**relay.body, "model": served})
        return self._relay(job, relay, candidates, route=f"fallback_{refused.code}")

    def _relay(
        self, job: GenerationJob, relay: Relay, candidates: list[Upstream], *, route: str
    ) -> Answer:
        self.sessions.starting(job.session)
        stream = self.router.open(
            relay.path, relay.body, candidates, route=route, session=job.session,
            trace_headers=relay.trace_headers,
        )  # fmt: skip
        answer = RelayedAnswer(self.router, stream, self.sessions)
        self.sessions.started(job.session, answer)
        return answer
