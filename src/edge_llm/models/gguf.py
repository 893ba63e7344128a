"""A GGUF file's metadata, read without loading the model (for Ollama's listings).

Only the key/value section is read; arrays are skipped (the tokenizer's vocabulary
is one), so a 262k-word vocabulary costs one seek per word, not its bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import IO, Any

_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_MAX_KEYS = 1 << 16
_MAX_STRING = 1 << 20  # a chat template fits; anything longer is skipped
# llama.cpp's general.file_type values (llama_ftype) and their names.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}  # fmt: skip


class GgufError(ValueError):
    """Not a GGUF file, or one cut short."""


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Scalar and string keys of the file (arrays and over-long strings left out)."""
    with open(path, "rb") as fh:
        if fh.read(4) != _MAGIC:
            raise GgufError(f"{path} is not a GGUF file")
        _version, _n_tensors, n_keys = struct.unpack("<IQQ", _exactly(fh, 20))
        if n_keys > _MAX_KEYS:
            raise GgufError(f"{path}: {n_keys} metadata keys")
        found: dict[str, Any] = {}
        for _ in range(n_keys):
            key = _string(fh)
            (kind,) = struct.unpack("<I", _exactly(fh, 4))
            value = _value(fh, kind)
            if key is not None and value is not None:
                found[key] = value
        return found


def _value(fh: IO[bytes], kind: int) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _exactly(fh, struct.calcsize(fmt)))[0]
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        element, count = struct.unpack("<IQ", _exactly(fh, 12))
        _skip_array(fh, element, count)
        return None
    raise GgufError(f"unknown GGUF value type {kind}")


def _skip_array(fh: IO[bytes], element: int, count: int) -> None:
    if element in _SCALARS:
        fh.seek(struct.calcsize(_SCALARS[element]) * count, 1)
    elif element == _STRING:
        for _ in range(count):
            (length,) = struct.unpack("<Q", _exactly(fh, 8))
            fh.seek(length, 1)
    else:
        for _ in range(count):
            _value(fh, element)


def _string(fh: IO[bytes]) -> str | None:
    (length,) = struct.unpack("<Q", _exactly(fh, 8))
    if length > _MAX_STRING:
        fh.seek(length, 1)
        return None
    return _exactly(fh, length).decode("utf-8", "replace")


def _exactly(fh: IO[bytes], n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise GgufError("GGUF metadata cut short")
    return data
