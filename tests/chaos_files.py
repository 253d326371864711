"""The files the chaos test's Lance writers write and its checker reads, on the local file system or, for a run on
an S3 warehouse, in the bucket. Lance names a file by its object-store path: no scheme, and on S3 no bucket."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from coordinator.lance.layout import manifest_name, object_path
from tests.delta.conftest import write_log_file
from tests.lance.conftest import stage


class ClientFiles:
    def __init__(self, store=None):
        self.store = store   # an obstore S3Store for the warehouse's bucket; None: local files

    def stage(self, location: str, version: int, data: bytes) -> str:
        """Write a staged manifest as Lance does (`_versions/<final name>-<uuid>`); returns its object path."""
        if self.store is None:
            return stage(location, version, data)
        import obstore
        key = f"{object_path(location).rstrip('/')}/_versions/{manifest_name(version, 'V2')}-{uuid.uuid4()}"
        obstore.put(self.store, key, data)
        return key

    def write_log(self, location: str, name: str, data: bytes) -> None:
        """Write a Delta log file, `<location>/_delta_log/<name>`, as a Delta client does."""
        if self.store is None:
            write_log_file(location, name, data)
            return
        self.put(location, f"_delta_log/{name}", data)

    def put(self, location: str, relative: str, data: bytes) -> str:
        """Write `<location>/<relative>` as a client does (a Delta data file, a staged commit); its object path."""
        path = f"{object_path(location).rstrip('/')}/{relative}"
        if self.store is None:
            Path("/" + path).parent.mkdir(parents=True, exist_ok=True)
            Path("/" + path).write_bytes(data)
            return path
        import obstore
        obstore.put(self.store, path, data)
        return path

    def remove(self, path: str) -> None:
        if self.store is None:
            Path("/" + path).unlink(missing_ok=True)
            return
        import obstore
        obstore.delete(self.store, path)

    def read(self, path: str) -> bytes | None:
        """The file's bytes; None if there is none."""
        if self.store is None:
            try:
                return Path("/" + path).read_bytes()
            except FileNotFoundError:
                return None
        import obstore
        try:
            return bytes(obstore.get(self.store, path).bytes())
        except FileNotFoundError:
            return None

    def versions_dir_names(self, location: str) -> list[str]:
        """The names in the table's `_versions/`."""
        directory = object_path(location).rstrip("/") + "/_versions"
        if self.store is None:
            return os.listdir("/" + directory)
        import obstore
        return [meta["path"].rsplit("/", 1)[1] for chunk in obstore.list(self.store, prefix=directory + "/")
                for meta in chunk]
