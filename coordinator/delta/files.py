"""What Delta reads in a table's location: only the first commit, `_delta_log/00000000000000000000.json`, when a
MANAGED table is created from its staging location (seed, Create a Table). The catalog writes nothing there:
clients write and publish the commit files; the catalog only ratifies them."""

from __future__ import annotations

from storage import errors as storage_errors
from storage.files import join

from ..errors import BadRequest, Unavailable
from .rules import FIRST_COMMIT_FILE


async def read_first_commit(files, location: str) -> bytes:
    """The bytes of version 0 at `location`; refused if it is not there (the client writes it before it creates
    the table), or is not a regular file reached from `location` without following a link."""
    log_file = join(location, "_delta_log", FIRST_COMMIT_FILE)
    try:
        return await files.read(log_file, within=location)
    except storage_errors.FileMissing:
        raise BadRequest(f"not a Delta table: {log_file} does not exist; write version 0 at the staging "
                         f"location before creating the table") from None
    except storage_errors.FileRefused as exc:   # a FIFO, a link, too large: the client's file, not ours to read
        raise BadRequest(f"not a Delta table: {exc}") from None
    except OSError as exc:
        raise Unavailable(f"cannot read {log_file}: {exc}") from None
