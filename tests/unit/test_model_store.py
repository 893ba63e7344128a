"""The model store on disk: names share blobs, broken manifests are skipped, the
free disk is checked before a download."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from edge_llm.models.download import NotEnoughDisk, check_disk
from edge_llm.models.sources import SourceError, check_name
from edge_llm.models.store import ModelStore, StoredModel


def stored(store: ModelStore, name: str, data: bytes) -> StoredModel:
    store.ensure()
    digest = hashlib.sha256(data).hexdigest()
    partial = store.partial_path(digest)
    partial.write_bytes(data)
    store.adopt_blob(partial, digest)
    return store.write_manifest(StoredModel(
        name=name, source="https://example.org/m.gguf", repo=None, filename="m.gguf",
        revision=None, size=len(data), sha256=digest, architecture="llama", quant="Q4_K_M",
        chat_template=True,
    ))  # fmt: skip


def test_two_names_share_one_blob_until_the_last_goes(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    first = stored(store, "hf.co/o/r:Q4_K_M", b"GGUF model bytes")
    stored(store, "mine", b"GGUF model bytes")
    assert [m.name for m in store.list()] == ["hf.co/o/r:Q4_K_M", "mine"]
    assert store.find("o/r:q4_k_m") == first  # the llama-server spelling, any case of quant
    store.remove("mine")
    assert Path(first.blob).is_file()
    store.remove("hf.co/o/r:Q4_K_M")
    assert not Path(first.blob).exists() and store.list() == []


def test_a_manifest_without_its_blob_or_foreign_is_not_a_model(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    model = stored(store, "a", b"bytes")
    Path(model.blob).unlink()
    (store.manifests / "junk.json").write_text("{not json")
    (store.manifests / "b.json").write_text('{"name": "not-b"}')
    assert store.list() == [] and store.find("a") is None


def test_the_free_disk_is_checked_before_a_download(tmp_path: Path) -> None:
    check_disk(tmp_path, 1024)
    with pytest.raises(NotEnoughDisk, match=r"needs .* MiB more"):
        check_disk(tmp_path, 1 << 60)


def test_a_name_given_other_bytes_releases_the_old_ones(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    old = stored(store, "m", b"old bytes")
    new = stored(store, "m", b"new bytes")
    store.release(old.sha256)
    assert not Path(old.blob).exists() and Path(new.blob).is_file()
    assert store.find("m") == new


def test_a_name_too_long_for_a_file_is_not_found_and_cannot_be_stored(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    stored(store, "a", b"bytes")  # manifests/ exists: the lookups reach the file system
    assert store.find("a" * 300) is None and store.find("a/" * 90 + "a") is None
    with pytest.raises(SourceError, match="too long"):
        check_name("a/" * 90 + "a")


def test_the_files_no_name_holds_are_swept_but_not_a_running_pulls(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    kept = stored(store, "kept", b"GGUF kept")
    old = store.blob_path(hashlib.sha256(b"GGUF old").hexdigest())
    old.write_bytes(b"GGUF old")  # a name's old bytes a server kept: no name holds them
    given_up = store.partial_path("a" * 64)
    given_up.write_bytes(b"GG")
    running = store.partial_path("b" * 64)
    running.write_bytes(b"GGU")
    lock = os.open(running.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a pull in another process holds its download
    try:
        assert store.orphans() == [given_up]  # the old blob may still be a pull's, unnamed
        assert store.orphans(naming_s=-1) == [old, given_up]
        assert store.sweep(naming_s=-1) == [(old, 8), (given_up, 2)]
        assert running.exists() and Path(kept.blob).is_file() and not old.exists()
    finally:
        os.close(lock)
    assert store.sweep(naming_s=-1) == [(running, 3)]  # that pull was given up too
    assert [m.name for m in store.list()] == ["kept"]
