"""Scale-out: several coordinator processes on one database, each table owned by one member at a time.

    leases.py    shard leases with epochs (fencing tokens), renewed in the background, taken over when expired
                 (their SQL, and the member rows', is storage/leases.py)
    channel.py   persistent TCP connections between members, length-prefixed frames
    routing.py   any member accepts any request and hands it to the owner (two-phase for multi-table commits)
    cluster.py   one member: the above wired together
"""

from storage.records import SHARDS, shard_of

from ..errors import NotOwner
from .cluster import Cluster

__all__ = ["Cluster", "NotOwner", "SHARDS", "shard_of"]
