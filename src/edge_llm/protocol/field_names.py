"""The field a misspelt request field was probably meant to be (``max_token`` ->
``max_tokens``), for the 400 that names the unknown field (no I/O)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel

_CLOSE_ENOUGH = 0.75


def did_you_mean(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """`` (did you mean `NAME`?)`` for the unknown field at ``loc`` (pydantic's error
    location: field names, list indexes, union branch names), or ``""``."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    known = {name for found in _models_at(model, loc[:-1]) for name in _field_names(found)}
    close = difflib.get_close_matches(loc[-1], sorted(known), n=1, cutoff=_CLOSE_ENOUGH)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _models_at(model: type[BaseModel], path: Sequence[int | str]) -> list[type[BaseModel]]:
    """The models the object at ``path`` may be (several behind a union)."""
    current = [model]
    for part in path:
        if isinstance(part, int):
            continue  # a list index: the same item model
        named = [m for m in current if m.__name__ == part]
        if named:  # a union branch pydantic tried
            current = named
            continue
        fields = [m.model_fields[part] for m in current if part in m.model_fields]
        current = [found for field in fields for found in _models_in(field.annotation)]
    return current


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [found for argument in get_args(annotation) for found in _models_in(argument)]


def _field_names(model: type[BaseModel]) -> set[str]:
    names = set(model.model_fields)
    names.update(f.alias for f in model.model_fields.values() if f.alias)
    return names
