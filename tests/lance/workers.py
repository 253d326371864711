"""Code that runs in the worker processes of the multi-process tests (importable, so picklable by reference)."""

from __future__ import annotations


def append_rows(uri: str, writer: int, count: int, results) -> None:
    """Append `count` one-row batches to db.hot through the namespace; report each acknowledged version."""
    import lance
    import lance_namespace
    import pyarrow as pa

    ns = lance_namespace.connect("rest", {"uri": uri})
    acked = []
    try:
        for i in range(count):
            ds = lance.write_dataset(pa.table({"a": [writer * 1000 + i]}), namespace_client=ns,
                                     table_id=["db", "hot"], mode="append")
            acked.append(ds.version)
    except Exception as exc:
        results.put((writer, acked, repr(exc)))
        return
    results.put((writer, acked, None))
