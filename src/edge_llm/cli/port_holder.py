"""Which process listens on a TCP port, for the one line ``serve`` prints when its
port is taken.

Linux only, and only what this user may see: ``/proc/net/tcp`` and ``tcp6`` give the
listening socket's inode, a process's ``/proc/PID/fd`` links name the sockets it
holds. Another user's process, or another system, gives None (the message then
says only that the port is taken).
"""

from __future__ import annotations

from pathlib import Path, PurePath

PROC = Path("/proc")
_LISTEN = "0A"  # the TCP state column of /proc/net/tcp
_MAX_COMMAND_CHARS = 80


def port_holder(port: int, proc: Path = PROC) -> str | None:
    """``'COMMAND' (pid N)`` of a process listening on ``port``, or None."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    for pid in _pids(proc):
        if _holds_any(proc / pid, inodes):
            return f"`{_command(proc / pid)}` (pid {pid})"
    return None


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """The socket inodes in state LISTEN on ``port``, IPv4 and IPv6."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _pids(proc: Path) -> list[str]:
    try:
        return sorted((entry.name for entry in proc.iterdir() if entry.name.isdigit()), key=int)
    except OSError:
        return []


def _holds_any(process: Path, inodes: set[str]) -> bool:
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        links = list((process / "fd").iterdir())
    except OSError:  # another user's process, or gone
        return False
    for link in links:
        try:
            if str(link.readlink()) in wanted:
                return True
        except OSError:
            continue
    return False


def _command(process: Path) -> str:
    """The command line as typed: ``edge-llm serve --port 8000``, not the interpreter
    and the script's full paths."""
    try:
        raw = (process / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    words = [word.decode("utf-8", "replace") for word in raw]
    words[:2] = [PurePath(word).name if word.startswith("/") else word for word in words[:2]]
    if len(words) > 1 and words[0].startswith("python") and not words[1].startswith("-"):
        words = words[1:]  # an interpreter running a script: the script is the command
    command = " ".join(words) or "?"
    if len(command) > _MAX_COMMAND_CHARS:
        command = command[: _MAX_COMMAND_CHARS - 1] + "…"
    return command
