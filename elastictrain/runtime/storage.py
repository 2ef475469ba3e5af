"""Where checkpoints live: a local/shared filesystem path, or an fsspec URL (``s3://``, ``gs://``,
``memory://``, ``file://`` ...) when fsspec is installed (``pip install elastictrain[fsspec]``).

Atomicity does not rest on the storage's rename: a checkpoint counts only once its manifests are
present and every checksum verifies, so a half-copied object on a store without atomic rename is
detected as incomplete.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import zlib
from typing import Iterator, Optional, Protocol

from ..errors import ConfigError

__all__ = ["Storage", "LocalStorage", "FsspecStorage", "open_storage", "CHUNK"]

CHUNK = 64 << 20


class Storage(Protocol):
    root: str

    def join(self, *parts: str) -> str: ...
    def makedirs(self, path: str) -> None: ...
    def write(self, path: str, data, fsync: bool) -> list[int]: ...
    def read_json(self, path: str) -> dict: ...
    def read_chunks(self, path: str, size: int) -> Iterator[bytes]: ...
    def read_all(self, path: str) -> bytes | bytearray: ...
    def size(self, path: str) -> int: ...
    def subdirs(self, path: str) -> list[str]: ...
    def rmtree(self, path: str) -> None: ...
    def sync_dir(self, path: str) -> None: ...


def _chunked_crcs(mv: memoryview) -> tuple[list[memoryview], list[int], threading.Thread]:
    chunks = [mv[off:off + CHUNK] for off in range(0, len(mv), CHUNK)]  # (none for a state without arrays)
    crcs = [0] * len(chunks)

    def checksum() -> None:  # on its own thread: zlib.crc32 and writes both release the GIL
        for i, c in enumerate(chunks):
            crcs[i] = zlib.crc32(c)

    t = threading.Thread(target=checksum, daemon=True)
    t.start()
    return chunks, crcs, t


class _Readable:
    """Reading shared by the storages: each supplies ``_open(path, mode)``."""

    def _open(self, path: str, mode: str):
        raise NotImplementedError

    def read_json(self, path: str) -> dict:
        with self._open(path, "rb") as f:
            return json.loads(f.read())

    def read_chunks(self, path: str, size: int) -> Iterator[bytes]:
        with self._open(path, "rb") as f:
            while True:
                b = f.read(size)
                if not b:
                    return
                yield b

    def read_all(self, path: str) -> bytearray:
        with self._open(path, "rb") as f:
            return bytearray(f.read())

    def read_bytes(self, path: str, limit: int = 64 << 20) -> bytes:
        """A small file's bytes (a manifest); refuses one larger than ``limit``."""
        with self._open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"{path} is larger than {limit} bytes")
        return data

    def writable(self) -> Optional[str]:
        """Why checkpoints cannot be written here, or None (checked where that is cheap)."""
        return None


class LocalStorage(_Readable):
    def __init__(self, root: str) -> None:
        self.root = root
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:  # at construction, not at the first save, and saying what to do
            raise ConfigError(f"the checkpoint directory {root} cannot be created ({exc.strerror or exc}: "
                              f"{exc.filename or root}); pass a directory this process can create and write, "
                              "or create it first") from exc

    def writable(self) -> Optional[str]:
        if not os.access(self.root, os.W_OK | os.X_OK):
            return f"the checkpoint directory {self.root} is not writable by this process (permission denied)"
        return None

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def write(self, path: str, data, fsync: bool) -> list[int]:
        """Write to ``path.tmp``, fsync, rename; returns the CRC-32 of each chunk."""
        tmp = path + ".tmp"
        chunks, crcs, summer = _chunked_crcs(memoryview(data))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for chunk in chunks:
                while chunk:
                    n = os.write(fd, chunk)
                    chunk = chunk[n:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
            summer.join()
        os.replace(tmp, path)
        return crcs

    def _open(self, path: str, mode: str):
        return open(path, mode)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def subdirs(self, path: str) -> list[str]:
        return [e for e in os.listdir(path) if os.path.isdir(os.path.join(path, e))]

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class FsspecStorage(_Readable):
    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError:
            raise ConfigError(f"checkpoint directory {url!r} is a URL: install fsspec "
                              "(`pip install elastictrain[fsspec]`) and the filesystem's package") from None
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.fs.makedirs(self.root, exist_ok=True)

    def join(self, *parts: str) -> str:
        return "/".join(p.rstrip("/") for p in parts)

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def write(self, path: str, data, fsync: bool) -> list[int]:
        chunks, crcs, summer = _chunked_crcs(memoryview(data))
        tmp = path + ".tmp"
        try:
            with self.fs.open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
        finally:
            summer.join()
        self.fs.mv(tmp, path)
        return crcs

    def _open(self, path: str, mode: str):
        return self.fs.open(path, mode)

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def subdirs(self, path: str) -> list[str]:
        return [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(path, detail=True)
                if e.get("type") == "directory"]

    def rmtree(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def sync_dir(self, path: str) -> None:
        pass  # object stores have no directory entries to sync


def open_storage(directory: str) -> Storage:
    """A :class:`LocalStorage` for a path, an :class:`FsspecStorage` for ``scheme://...``."""
    if "://" in directory:
        return FsspecStorage(directory)
    return LocalStorage(directory)
