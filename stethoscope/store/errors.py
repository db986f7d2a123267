"""The store's errors, below every module that raises them (store/client.py re-exports them)."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store could not do what was asked; the message is meant for a human. `data_fault`: the
    store (or the client, serialising a value) refused the data sent, not the statement or its own
    state: only then may a row be blamed (store/salvage.py)."""

    def __init__(self, message: str, *, data_fault: bool = False):
        super().__init__(message)
        self.data_fault = data_fault


class SchemaMissing(StoreError):
    """The database, or a table `db init` creates, does not exist: a configuration error (exit 2),
    not a failed run."""
