"""One member of a coordinator cluster: its leases, its internal-channel server, its connections to peers."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import trio

from ..config import ConfigError
from .channel import VERSION, ChannelServer, Codec, Peer, speaks
from .leases import Leases
from .routing import Router
from .secret import channel_key

if TYPE_CHECKING:
    from ..format import Services

log = logging.getLogger(__name__)


class Cluster:
    def __init__(self, services: Services):
        config = services.config
        self.config = config
        self.registry = services.registry
        self.store = services.store
        self.member_id = uuid.uuid4()
        self.leases = Leases(self.store, self.member_id, ttl_s=config.lease_ttl_s, renew_s=config.lease_renew_s,
                             margin_s=config.lease_margin_s)
        self.router = Router(self)
        # What a proposal may refer to that only makes sense in this process: sent by name, resolved at the peer.
        self.codec = Codec({"files": services.files, "store": services.store})
        try:
            self.versions = speaks(config.cluster_channel_version)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        # The channel's HMAC key (`server.key`, also dialled with): the cluster's own secret (secret.py), read
        # here so that a missing or exposed one stops the start with a message.
        self.server = ChannelServer(self.codec, {
            "submit": self.router.on_submit, "create": self.router.on_create, "prepare": self.router.on_prepare,
            "verdict": self.router.on_verdict, "forget": self.router.on_forget, "ping": self._ping},
            channel_key(config), versions=self.versions)
        self.peers: dict[str, Peer] = {}
        self.nursery: trio.Nursery | None = None
        self.address: str | None = None
        self._watched: set[tuple[int, uuid.UUID, Any]] = set()
        self.leases.on_round.append(self._abandon_calls_to_former_owners)
        self.registry.cluster = self
        services.metrics.add_gauges(self.gauges)
        services.metrics.add_counters(self.counters)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve the channel, then join: `started` once the first lease pass is done (this member then owns its
        share of shards if any were free)."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                listeners = await nursery.start(self.server.serve, self.config.cluster_host, self.config.cluster_port)
                port = listeners[0].socket.getsockname()[1]
                self.address = self.config.cluster_advertise or f"{self.config.cluster_host}:{port}"
                self.leases.address = self.address
                await nursery.start(self.leases.run)
                log.info("cluster member %s on %s holds %d shards (%d members live)", self.member_id, self.address,
                         len(self.leases.held), self.leases.live_members)
                task_status.started(self)
        finally:
            if not self.leases.stopping:   # cancelled without a hand-over (an embedding program's own stop)
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await self.leases.leave()
                    except Exception as exc:
                        log.warning("could not release leases on the way out: %s", exc)

    async def hand_over(self, grace_s: float) -> None:
        """A graceful stop, before anything is cancelled: serve no shard from now on (requests for them are
        answered NotOwner, and the members that forwarded them send them to the next owner), answer every call
        already accepted (within `grace_s`), then release the leases, so the others take the tables over at once.
        Clients see latency, never an error."""
        shards = self.leases.stop_serving()
        unanswered = await self.server.drain(grace_s)
        if unanswered:
            log.warning("%d forwarded calls still unanswered after %.1f s; leaving anyway", unanswered, grace_s)
        try:
            await self.leases.leave()
        except Exception as exc:  # the leases then expire by themselves, lease_ttl_s from now
            log.warning("could not release leases on the way out: %s", exc)
        log.info("handed over shards %s", shards)

    def peer(self, address: str) -> Peer:
        peer = self.peers.get(address)
        if peer is None:
            peer = self.peers[address] = Peer(address, self.codec, self.nursery, self.server.key,
                                              versions=self.versions)
        return peer

    async def call_watching(self, peer: Peer, shard: int, member: uuid.UUID, method: str, *args: Any) -> Any:
        """`peer.call`, abandoned (AnswerLost) as soon as the lease map shows `member` no longer owns `shard`."""
        entries = []

        def watch(pending: Any) -> None:
            entry = (shard, member, pending)
            entries.append(entry)
            self._watched.add(entry)
        try:
            return await peer.call(method, *args, watch=watch)
        finally:
            for entry in entries:
                self._watched.discard(entry)

    def _abandon_calls_to_former_owners(self) -> None:
        for shard, member, pending in list(self._watched):
            owner = self.leases.owner(shard)
            if owner is None or owner.member != member:
                Peer.abandon(pending)

    async def _ping(self) -> str:
        return str(self.member_id)

    def gauges(self) -> dict[str, float]:
        older = sum(n for version, n in self.server.agreed.items() if version < VERSION) + sum(
            1 for p in self.peers.values() if p.connected and p.version is not None and p.version < VERSION)
        return {"coordinator_cluster_shards_held": len(self.leases.held),
                "coordinator_cluster_members_live": self.leases.live_members,
                "coordinator_cluster_channel_version": self.versions[1],
                "coordinator_cluster_channel_connections_older": older}

    def counters(self) -> dict[str, float]:
        return {"coordinator_cluster_takeovers_total": self.leases.takeovers,
                "coordinator_cluster_forwarded_total": self.router.forwarded}
