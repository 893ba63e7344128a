"""The WebSocket stream protocol (docs/design.md §6) as a sans-I/O state machine.

Text frames in, commands and frames out; no socket, loop or clock. The adapter
feeds each received text frame to :meth:`StreamProtocol.receive`, carries out the
returned commands (start, pause, resume, cancel a stream), reports what the
engine did through the ``on_*`` methods, and sends whatever
:meth:`StreamProtocol.frames_to_send` returns. A malformed or out-of-order frame
produces an ``error`` frame and leaves the protocol usable.

    IDLE --start--> STREAMING --done/error--> IDLE   (one stream at a time)
    IDLE --resume with stream_id--> STREAMING        (a detached stream taken up)
    STREAMING: pause/resume toggle ``client_paused``; cancel ends the stream.

A ``start`` frame with ``"resumable": true`` asks for a stream that survives a
dropped socket: its ``started`` frame names it (``stream_id``) and every frame of
the stream carries ``n`` (1, 2, ...); a new socket sends ``{"type": "resume",
"stream_id": ..., "last_event_id": n}`` to get the frames after ``n``, then the
stream live.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from edge_llm.errors import InvalidRequest
from edge_llm.protocol.json_body import decode_json
from edge_llm.protocol.stream_events import Heartbeat


class State(enum.Enum):
    IDLE = "idle"
    STREAMING = "streaming"


class Frame(enum.StrEnum):
    """Every frame's ``type``: the client sends start, pause, resume and cancel; the
    server the others. Both sides name them from here (``client/ws_transport.py``)."""

    START = "start"
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    STARTED = "started"
    DELTA = "delta"
    HEARTBEAT = "heartbeat"
    PAUSED = "paused"
    RESUMED = "resumed"
    DONE = "done"
    ERROR = "error"


def start_frame(request: dict[str, Any]) -> dict[str, Any]:
    """The client's first frame: a chat completion body to stream."""
    return {"type": Frame.START.value, "request": request}


def control_frame(kind: Frame) -> dict[str, str]:
    """The client's pause, resume or cancel frame."""
    return {"type": kind.value}


@dataclass(frozen=True)
class StartStream:
    request: dict[str, Any]
    resumable: bool = False


@dataclass(frozen=True)
class ResumeDetached:
    """Take up the resumable stream ``stream_id`` after its frame ``after``."""

    stream_id: str
    after: int


@dataclass(frozen=True)
class PauseStream:
    pass


@dataclass(frozen=True)
class ResumeStream:
    pass


@dataclass(frozen=True)
class CancelStream:
    pass


Command = StartStream | PauseStream | ResumeStream | CancelStream | ResumeDetached


def _event_number(value: object) -> int | None:
    """``n`` of a ``last_event_id``: the number, or ``"<stream_id>.<n>"`` as in SSE."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        number = value.rpartition(".")[2]
        return int(number) if number.isdigit() and len(number) <= 18 else None
    return None


class StreamProtocol:
    def __init__(self) -> None:
        self.state = State.IDLE
        self.client_paused = False
        self.stream_id: str | None = None
        self._out: list[dict[str, Any]] = []

    def frames_to_send(self) -> list[dict[str, Any]]:
        """Frames produced since the last call, in order; the caller sends them."""
        frames, self._out = self._out, []
        return frames

    # -- client frames ---------------------------------------------------------------

    def receive(self, text: str) -> list[Command]:
        """One client text frame in; the commands the adapter must carry out."""
        frame = self._decode(text)
        if frame is None:
            return []
        kind = frame.get("type")
        if kind == Frame.START:
            return self._start(frame)
        if kind == Frame.PAUSE:
            return self._pause()
        if kind == Frame.RESUME and "stream_id" in frame:
            return self._resume_detached(frame)
        if kind == Frame.RESUME:
            return self._resume()
        if kind == Frame.CANCEL:
            return self._cancel()
        self._error("unknown_frame_type", f"unknown frame type {kind!r}")
        return []

    def _decode(self, text: str) -> dict[str, Any] | None:
        try:
            frame = decode_json(text, what="frame")
        except InvalidRequest as exc:
            extra = {"param": exc.param} if exc.param else {}
            self._error("invalid_frame", exc.message, **extra)
            return None
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            self._error("invalid_frame", 'frame must be a JSON object with a string "type"')
            return None
        return frame

    def _start(self, frame: dict[str, Any]) -> list[Command]:
        if self.state is State.STREAMING:
            self._error("stream_active", "a stream is already running on this socket")
            return []
        request = frame.get("request")
        if not isinstance(request, dict):
            self._error("invalid_frame", 'start needs "request": a chat completion body')
            return []
        resumable = frame.get("resumable", False)
        if not isinstance(resumable, bool):
            self._error("invalid_frame", '"resumable" must be true or false', param="resumable")
            return []
        self.state = State.STREAMING
        self.client_paused = False
        return [StartStream(request, resumable)]

    def _resume_detached(self, frame: dict[str, Any]) -> list[Command]:
        if self.state is State.STREAMING:
            self._error("stream_active", "a stream is already running on this socket")
            return []
        stream_id, after = frame.get("stream_id"), _event_number(frame.get("last_event_id", 0))
        if not isinstance(stream_id, str) or not stream_id or after is None:
            self._error(
                "invalid_frame",
                'resume needs "stream_id" and "last_event_id" (the n of the last frame taken)',
            )
            return []
        return [ResumeDetached(stream_id, after)]

    def _pause(self) -> list[Command]:
        if self.state is not State.STREAMING:
            self._error("no_active_stream", "pause without a running stream")
            return []
        if self.client_paused:
            self._error("already_paused", "the stream is already paused")
            return []
        self.client_paused = True
        return [PauseStream()]

    def _resume(self) -> list[Command]:
        if self.state is not State.STREAMING:
            self._error("no_active_stream", "resume without a running stream")
            return []
        if not self.client_paused:
            self._error("not_paused", "resume without a preceding pause")
            return []
        self.client_paused = False
        return [ResumeStream()]

    def _cancel(self) -> list[Command]:
        if self.state is not State.STREAMING:
            self._error("no_active_stream", "cancel without a running stream")
            return []
        return [CancelStream()]

    # -- what the engine did ------------------------------------------------------------------

    def on_started(self, stream_id: str, resumable_id: str | None = None) -> None:
        """``resumable_id``: the id a new socket resumes the stream by."""
        self.stream_id = stream_id
        frame = {"type": Frame.STARTED.value, "id": stream_id}
        if resumable_id is not None:
            frame["stream_id"] = resumable_id
        self._out.append(frame)

    def on_taken_up(self, stream_id: str) -> None:
        """A detached stream now streams on this socket (pause, resume, cancel apply)."""
        self.state = State.STREAMING
        self.client_paused = False
        self.stream_id = stream_id

    def on_ended_elsewhere(self) -> None:
        """The stream this socket took up ended (its last frames came through it)."""
        self._end()

    def on_rejected(self, code: str, message: str, **extra: Any) -> None:
        """The start request was refused before a stream existed."""
        self.state = State.IDLE
        self._error(code, message, **extra)

    def on_delta(self, text: str, n_tokens: int, seq: int) -> None:
        self._out.append(
            {
                "type": Frame.DELTA.value,
                "id": self.stream_id,
                "seq": seq,
                "text": text,
                "n_tokens": n_tokens,
            }
        )

    def on_heartbeat(self, heartbeat: Heartbeat) -> None:
        """While no token flows: the stream's state, prefill progress, place in the
        queue and predicted wait for its first token."""
        self._out.append({"type": Frame.HEARTBEAT.value, **heartbeat.progress()})

    def on_paused(self, cause: str) -> None:
        """Cause ``client``, ``socket_full`` or ``preempted`` (a more urgent request
        took its place; it resumes by itself, ``resumed`` follows)."""
        self._out.append({"type": Frame.PAUSED.value, "cause": cause})

    def on_resumed(self) -> None:
        self._out.append({"type": Frame.RESUMED.value})

    def on_done(self, finish_reason: str, usage: dict[str, Any], stats: dict[str, Any]) -> None:
        self._out.append(
            {
                "type": Frame.DONE.value,
                "id": self.stream_id,
                "finish_reason": finish_reason,
                "usage": usage,
                "stats": stats,
            }
        )
        self._end()

    def on_failed(self, code: str, message: str, **extra: Any) -> None:
        """The stream ended with an error (cancelled, timed out, backend failure)."""
        self._error(code, message, id=self.stream_id, **extra)
        self._end()

    def _end(self) -> None:
        self.state = State.IDLE
        self.client_paused = False
        self.stream_id = None

    def _error(self, code: str, message: str, **extra: Any) -> None:
        self._out.append({"type": Frame.ERROR.value, "code": code, "message": message, **extra})
