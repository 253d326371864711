"""What the store and the file IO raise. They know tables, namespaces and files, never a protocol or a format:
the coordinator maps these to its own errors in one place (`coordinator.errors.from_storage`)."""

from __future__ import annotations


class StorageError(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class StoreUnavailable(StorageError):
    """The database could not be reached, or refused the statement: known NOT applied, safe to retry."""


class OutcomeLost(StorageError):
    """The write was sent but its result was lost: it may or may not have applied."""


class NamespaceMissing(StorageError):
    """The namespace (or the parent of a new one) does not exist."""


class NamespaceExists(StorageError):
    pass


class NamespaceNotEmpty(StorageError):
    """The namespace holds tables, views or namespaces."""


class NamespaceRefilled(NamespaceNotEmpty):
    """A cascading drop found tables created in the namespace while it was being dropped."""


class FileMissing(StorageError):
    """The file does not exist."""


class FileRefused(StorageError):
    """A path or file the file IO will not read or write: not a file, too large, reached through a link, or a
    storage scheme it does not serve."""


class FileTaken(FileRefused):
    """An object store already holds other bytes under a name the file IO was to create: left as it is."""


class DatabaseUnreachable(StorageError):
    """No connection to PostgreSQL could be made at start-up within the database timeout."""


class FileUnavailable(StorageError):
    """A file could not be read in time (or another process holds it): nothing was changed, safe to retry."""
