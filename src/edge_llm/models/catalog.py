"""Pulled models as served ones: ``--model hf.co/OWNER/REPO:QUANT``, ``--model
NAME=hf.co/...``, ``[models.NAME] path = "hf.co/..."`` and a pulled name resolve to
the stored file; a Hub source that is not pulled yet is an error naming the command
that pulls it, unless ``pull = "missing"`` (``--pull missing``) pulls it first, at
the start for the configuration's models, on first use for a request's ``model``.
"""

from __future__ import annotations

import logging
import os

from edge_llm.config.tree import EngineConfig
from edge_llm.errors import ModelNotFound
from edge_llm.models.hub import RemoteError
from edge_llm.models.pull import Puller, PullStatus, Report
from edge_llm.models.sources import SourceError, looks_pullable, parse_hub
from edge_llm.models.spec import ModelSpec, pulled_spec
from edge_llm.models.store import ModelStore, StoredModel

_log = logging.getLogger(__name__)
_LOG_EVERY = 0.1  # a line per tenth of a download pulled for a request


class NotPulled(LookupError):
    """A model named by a source that is not in the store (and may not be pulled now)."""


class Catalog:
    def __init__(self, store: ModelStore, *, pull_missing: bool) -> None:
        self.store = store
        self.pull_missing = pull_missing

    @classmethod
    def of(cls, config: EngineConfig) -> Catalog:
        return cls(ModelStore(config.model.models_dir), pull_missing=config.model.pull == "missing")

    def names_a_model(self, text: str) -> bool:
        """``text`` is not a file but a pulled name or a Hub source."""
        return not os.path.exists(text) and (
            self.store.find(text) is not None or looks_pullable(text)
        )

    async def ensure(self, text: str, report: Report) -> StoredModel:
        """The stored model ``text`` names, pulled now if it is a Hub source and
        pulling missing models is allowed; else NotPulled."""
        stored = self.store.find(text)
        if stored is not None:
            return stored
        if not looks_pullable(text):
            raise NotPulled(f"{text!r} is neither a file nor a pulled model (see edge-llm list)")
        if not self.pull_missing:
            raise NotPulled(
                f"{text} is not pulled: run `edge-llm pull {text}` first, or serve with "
                '--pull missing (pull = "missing" in [engine]) to pull it at start'
            )
        return await Puller(self.store).pull(parse_hub(text), report)

    async def resolve_config(self, config: EngineConfig, report: Report) -> EngineConfig:
        """``config`` with every model path that names a pulled model (or a Hub
        source) replaced by the stored file; the default model is then served under
        the pulled name unless ``model_id`` says otherwise."""
        model = config.model
        update: dict[str, object] = {}
        if model.model_path and self.names_a_model(model.model_path):
            stored = await self.ensure(model.model_path, report)
            update["model"] = model.model_copy(
                update={"model_path": stored.blob, "model_id": model.model_id or stored.name}
            )
        entries = dict(config.models)
        for name, entry in config.models.items():
            if self.names_a_model(entry.path):
                stored = await self.ensure(entry.path, report)
                entries[name] = entry.model_copy(update={"path": stored.blob})
        return config.model_copy(update={**update, "models": entries})

    def pull_key(self, name: str) -> str | None:
        """The source a request's ``model`` names, one name for all its spellings
        (``o/r:q4_k_m`` is ``hf.co/o/r:Q4_K_M``), when it may be pulled on first use;
        else None."""
        if not self.pull_missing or not looks_pullable(name):
            return None
        try:
            return parse_hub(name).name
        except SourceError:
            return name  # pulled to say why it cannot be (404 model_not_found)

    async def pull_on_use(
        self, config: EngineConfig, name: str, report: Report
    ) -> ModelSpec | None:
        """A request's ``model`` that names a Hub source not pulled yet, pulled now when
        ``pull = "missing"`` (its requests wait, told each step through ``report``;
        the server log shows a line per tenth); None when it may not be pulled. A
        failed pull is 404 ``model_not_found`` saying why."""
        if self.pull_key(name) is None:
            return None
        _log.info("pulling %s for a request (pull = missing)", name)
        logged = _Logged(name)

        def both(event: PullStatus) -> None:
            logged(event)
            report(event)

        try:
            stored = await self.ensure(name, both)
        except (RemoteError, OSError, SourceError, NotPulled) as exc:  # OSError: the store
            raise ModelNotFound(f"model {name!r} could not be pulled: {exc}",
                                param="model") from exc  # fmt: skip
        return pulled_spec(config, stored.name, stored.blob)


class _Logged:
    """A pull's progress as a log line per tenth of the file."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.logged = -1

    def __call__(self, event: PullStatus) -> None:
        if event.completed is None or not event.total:
            return
        tenth = int(event.completed / event.total / _LOG_EVERY)
        if tenth > self.logged:
            self.logged = tenth
            _log.info("pulling %s: %d%% of %d MiB", self.name, 100 * event.completed //
                      event.total, event.total >> 20)  # fmt: skip
