"""High availability under a real HA engine: PostgreSQL 15 under Patroni 3.0 with etcd 3.4 (Debian's packages).

`pytest tests/ha` injects each fault once; `python -m tests.ha --rounds 5` is the full proof, which CI runs in its place
(.ci/run; docs/high-availability.md has its figures)."""
