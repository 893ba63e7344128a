"""OpenAI's ``POST /v1/embeddings``: the request and the response object (sans-I/O)."""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from edge_llm.protocol.openai import Strict

_Text = Annotated[str, Field(max_length=1 << 20)]
_Tokens = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class EmbeddingsRequest(Strict):
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    input: _Text | list[_Text] | _Tokens | list[_Tokens]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text or a list of token ids (a flat list of ints is one)."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and all(isinstance(item, int) for item in value):
            return [list(value)]  # type: ignore[arg-type]
        return list(value)  # type: ignore[arg-type]


def embedding_list(
    model: str, vectors: Sequence[Sequence[float]], n_tokens: int, encoding: str
) -> dict[str, Any]:
    """The response: one ``embedding`` object per input, in order."""
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(vector, encoding)}
        for i, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _encoded(vector: Sequence[float], encoding: str) -> list[float] | str:
    """``base64``: little-endian float32s, as OpenAI sends them (the SDK's default)."""
    if encoding != "base64":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
