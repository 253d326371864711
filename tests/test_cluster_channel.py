"""The cluster's internal channel (coordinator/cluster/channel.py): frames, local objects by name, errors, and a
lost answer, over real loopback TCP between two channel endpoints in one trio run."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import uuid
from decimal import Decimal

import msgpack
import pydantic
import pytest
import trio
import trio.testing

from coordinator.cluster.channel import (GREETING, MAGIC, VERSION, AnswerLost, ChannelServer, Codec, Peer, PeerUnreachable,
                                         read_frames)
from coordinator.cluster import wire
from coordinator.cluster.wire import WireError
from coordinator.errors import CoordinatorError, Unavailable, VersionExists
from loadtest.channel_bench import Files, forwarded_commits


KEY = b"k" * 32


class Local:
    """Stands for a process-local object (the file IO): each side has its own."""


@pytest.mark.parametrize("piece", [1, 3, 7_001, 1 << 20])
async def test_frames_survive_any_split(piece):
    codec = Codec({})
    sizes = (0, 1, 70_000, 3, 2, 5)
    frames = b"".join(codec.frame(("x" * n, n)) for n in sizes)
    send, receive = trio.testing.memory_stream_pair()

    async def trickle():
        for i in range(0, len(frames), piece):
            await send.send_all(frames[i:i + piece])
        await send.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        got = [codec.loads(p) async for p in read_frames(receive)]
    assert got == [("x" * n, n) for n in sizes]


async def test_calls_results_errors_and_local_objects():
    mine, theirs = Local(), Local()
    release = trio.Event()

    async def echo(value, obj):
        return value, obj is theirs

    async def conflict():
        raise VersionExists("expected 1, found 2")

    async def crash():
        raise ValueError("boom")

    async def hang():
        await release.wait()

    server = ChannelServer(Codec({"files": theirs}), {"echo": echo, "conflict": conflict, "crash": crash,
                                                      "hang": hang}, KEY)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(server.serve, "127.0.0.1", 0)
        port = listeners[0].socket.getsockname()[1]
        peer = Peer(f"127.0.0.1:{port}", Codec({"files": mine}), nursery, KEY)
        # The local object travels by name and arrives as the receiver's own.
        assert await peer.call("echo", {"a": [1, 2]}, mine) == ({"a": [1, 2]}, True)
        try:
            await peer.call("conflict")
        except VersionExists as exc:   # the error's own class, not only a CoordinatorError
            assert (exc.message, exc.status) == ("expected 1, found 2", 409)
        else:
            raise AssertionError("no error")
        try:
            await peer.call("crash")
        except CoordinatorError as exc:
            assert "ValueError: boom" in exc.message and exc.status == 500
        # Concurrent calls on one connection; one abandoned by its caller comes back as AnswerLost.
        results = []

        async def waiting():
            try:
                await peer.call("hang", watch=lambda pending: results.append(pending))
            except AnswerLost:
                results.append("lost")
        nursery.start_soon(waiting)
        await trio.testing.wait_all_tasks_blocked()
        assert await peer.call("echo", 1, None) == (1, False)
        Peer.abandon(results[0])
        await trio.testing.wait_all_tasks_blocked()
        assert results[-1] == "lost"
        release.set()
        nursery.cancel_scope.cancel()


async def test_unreachable_peer_is_known_not_sent():
    async with trio.open_nursery() as nursery:
        from storage.embedded import free_port
        peer = Peer(f"127.0.0.1:{free_port()}", Codec({}), nursery, KEY)
        try:
            await peer.call("echo", 1)
        except PeerUnreachable as exc:
            assert isinstance(exc, Unavailable)
        else:
            raise AssertionError("no error")


async def test_nothing_is_read_from_a_connection_without_the_cluster_key():
    """A dialer must prove it holds the cluster key before any frame is read, and a listener must prove it too
    before the dialer reads answers."""
    async def echo(value):
        return value

    server = ChannelServer(Codec({}), {"echo": echo}, KEY)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(server.serve, "127.0.0.1", 0)
        port = listeners[0].socket.getsockname()[1]
        # a peer with another key is refused before sending anything
        try:
            await Peer(f"127.0.0.1:{port}", Codec({}), nursery, b"x" * 32).call("echo", 1)
        except PeerUnreachable as exc:
            assert "handshake" in exc.message
        else:
            raise AssertionError("a peer without the key was served")
        # a raw connection that skips the handshake and sends a frame straight away is closed unanswered
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(GREETING + Codec({}).frame((0, "echo", (1,))) + b"\0" * 48)
        received = b""
        with trio.fail_after(10):
            try:
                while data := await stream.receive_some(1024):  # the greeting, then the server hangs up
                    received += data
            except trio.BrokenResourceError:
                pass  # reset: it closed with our unread bytes in its buffer
        await stream.aclose()
        assert len(received) == len(GREETING) + 16
        # and the right key still works
        assert await Peer(f"127.0.0.1:{port}", Codec({}), nursery, KEY).call("echo", 7) == 7
        nursery.cancel_scope.cancel()


def test_a_frame_can_only_build_values_never_run_code():
    """Pickle would call whatever a frame names; the channel's encoding builds only plain data and the project's
    own classes, so a frame naming anything else is refused before any of it is used."""
    codec = Codec({})
    for name in ("os:system", "builtins:eval", "subprocess:Popen", "coordinator.cluster.wire:_own_class",
                 "coordinator.errors:from_storage"):
        for code, parts in ((wire._OBJECT, [{}]), (wire._ERROR, [[], {}]), (wire._ENUM, [1]),
                            (wire._NAMEDTUPLE, [1]), (wire._ERROR, [])):
            with pytest.raises(WireError):
                codec.loads(msgpack.packb([msgpack.ExtType(code, name.encode()), *parts]))
    with pytest.raises(TypeError, match="cannot cross"):
        codec.dumps(Local())  # a type outside the project is never sent either


@pytest.mark.parametrize("value", [
    [1, msgpack.ExtType(wire._TUPLE, b"")],                  # a head that is not the first item of its array
    msgpack.ExtType(wire._TUPLE, b""),                        # ... nor in an array at all
    {"a": msgpack.ExtType(wire._SET, b"")},
    [msgpack.ExtType(wire._TUPLE, b""), msgpack.ExtType(wire._TUPLE, b"")],
    [msgpack.ExtType(wire._TUPLE, b"os:system"), 1],          # a head that names nothing naming something
    [msgpack.ExtType(99, b""), 1],                            # an extension type that does not exist
    [msgpack.ExtType(wire._MAPPINGPROXY, b""), [1]],          # a frozen dict of a list
], ids=["not-first", "alone", "map-value", "two-heads", "tuple-naming", "unknown-code", "bad-parts"])
def test_a_frame_whose_heads_are_out_of_place_is_refused(value):
    with pytest.raises(WireError):
        Codec({}).loads(msgpack.packb(value))


def test_the_projects_own_values_cross_intact():
    from storage.records import Refusal
    values = [(1, "a", None), {1: b"x", "k": {uuid.uuid4()}}, frozenset({2}), 2**70, -2**70, Decimal("1.5"),
              datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), Refusal.STALE,
              VersionExists("expected 1, found 2"), {(1, "a"): [(2,), []]}, [[], [[]], ()]]
    back = Codec({}).loads(Codec({}).dumps(values))
    assert back[:8] == values[:8] and type(back[0]) is tuple
    assert type(back[8]) is VersionExists and back[8].message == "expected 1, found 2" and back[8].status == 409
    assert back[9:] == values[9:] and type(back[10][2]) is tuple


def _assert_identical(sent, got, mine, theirs, where="value"):
    """`got` is what `sent` was, attribute by attribute (a pydantic model's fields set, extra and private
    attributes too, which a rebuild by validation could change), with this side's process-local object in
    place of the sender's."""
    if sent is mine:
        assert got is theirs, where
        return
    assert type(got) is type(sent), f"{where}: {type(got)} is not {type(sent)}"
    if isinstance(sent, pydantic.BaseModel):
        for attr in ("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
            assert getattr(got, attr) == getattr(sent, attr), f"{where}.{attr}"
        _assert_identical(vars(sent), vars(got), mine, theirs, where)
    elif dataclasses.is_dataclass(sent):
        for field in dataclasses.fields(sent):
            _assert_identical(getattr(sent, field.name), getattr(got, field.name), mine, theirs,
                              f"{where}.{field.name}")
    elif isinstance(sent, functools.partial):
        assert got.func == getattr(theirs, sent.func.__name__) and sent.func == getattr(mine, sent.func.__name__)
        _assert_identical((sent.args, sent.keywords), (got.args, got.keywords), mine, theirs, where)
    elif isinstance(sent, (list, tuple)):
        assert len(got) == len(sent), where
        for i, (a, b) in enumerate(zip(sent, got)):
            _assert_identical(a, b, mine, theirs, f"{where}[{i}]")
    elif isinstance(sent, dict):
        assert list(got) == list(sent), where
        for key in sent:
            _assert_identical(sent[key], got[key], mine, theirs, f"{where}[{key!r}]")
    else:
        assert got == sent, where


@pytest.mark.parametrize("fmt", ["iceberg", "delta", "lance"])
def test_a_forwarded_commit_arrives_exactly_as_it_was_sent(fmt):
    """What the owner decides on is the very proposal the forwarding member built: the same classes, fields,
    fields set and extras, not a re-validated copy (which could differ from what was checked at the edge). The
    owner's reply comes back as exactly."""
    mine, theirs = Files(), Files()
    proposal, reply = forwarded_commits(mine)[fmt]
    message = (7, "submit", (uuid.uuid4(), proposal, uuid.uuid4()))
    got = Codec({"files": theirs}).loads(Codec({"files": mine}).dumps(message))
    _assert_identical(message, got, mine, theirs)
    back = Codec({}).loads(Codec({}).dumps(reply))
    if reply is None:
        assert back is None
    else:
        assert isinstance(back, type(reply))
        assert [getattr(back, f.name) for f in dataclasses.fields(reply) if f.compare] == \
            [getattr(reply, f.name) for f in dataclasses.fields(reply) if f.compare]


@pytest.mark.parametrize("greeting", [MAGIC + bytes([VERSION + 1]), b""], ids=["newer", "before-versions"])
async def test_members_of_different_versions_refuse_each_other_clearly(greeting):
    """A listener of another channel version (or one from before versions existed, which sends only its 16-byte
    challenge) is refused by the dialer with a message that says so, before anything else is sent."""
    async def other_member(stream):
        await stream.send_all(greeting + b"n" * 16)
        await trio.sleep(5)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, other_member, 0)
        port = listeners[0].socket.getsockname()[1]
        expected = (f"speaks cluster channel version {VERSION + 1}, this member version {VERSION}" if greeting
                    else "speaks an older cluster channel")
        with pytest.raises(PeerUnreachable, match=expected):
            await Peer(f"127.0.0.1:{port}", Codec({}), nursery, KEY).call("echo", 1)
        nursery.cancel_scope.cancel()


async def test_a_peer_that_goes_away_is_no_error(caplog):
    """A member killed mid-conversation resets its connections: the server drops them quietly (no ERROR log, no
    traceback), as the normal end of a peer, and goes on serving others."""
    import logging
    import socket
    import struct

    async def slow(value):
        await trio.sleep(0.5)
        return value

    server = ChannelServer(Codec({}), {"slow": slow}, KEY)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(server.serve, "127.0.0.1", 0)
        port = listeners[0].socket.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="coordinator.cluster.channel"):
            peer = Peer(f"127.0.0.1:{port}", Codec({}), nursery, KEY)
            nursery.start_soon(lambda: _ignore_loss(peer.call("slow", 1)))
            await trio.sleep(0.1)
            # a reset, as the kernel sends for a process killed with SIGKILL
            peer._stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer._stream.socket.close()
            await trio.sleep(0.3)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert await Peer(f"127.0.0.1:{port}", Codec({}), nursery, KEY).call("slow", 2) == 2
        nursery.cancel_scope.cancel()


async def _ignore_loss(call) -> None:
    try:
        await call
    except AnswerLost:
        pass


def test_the_channel_key_is_the_clusters_own_secret(tmp_path):
    """The data dir's cluster.key (0600, made once, shared by members there) or a configured file; members that may
    run on several hosts must be given one; a file others may read, or a short secret, stops the start."""
    from coordinator.cluster.secret import channel_key
    from coordinator.config import Config, ConfigError

    config = Config(data_dir=tmp_path / "data", cluster=True)
    key = channel_key(config)
    assert (tmp_path / "data" / "cluster.key").stat().st_mode & 0o777 == 0o600
    assert channel_key(Config(data_dir=tmp_path / "data", cluster=True)) == key   # another member there
    assert channel_key(Config(data_dir=tmp_path / "other", cluster=True)) != key
    for far in (dict(cluster_advertise="10.0.0.5:9181"), dict(cluster_host="0.0.0.0")):
        with pytest.raises(ConfigError, match="--cluster-secret-file"):
            channel_key(Config(data_dir=tmp_path / "data", cluster=True, **far))
    secret = tmp_path / "cluster.secret"
    secret.write_text("s" * 64 + "\n")
    for mode, wanted in ((0o644, "chmod 600"), (0o606, "chmod 600")):
        secret.chmod(mode)
        with pytest.raises(ConfigError, match=wanted):
            channel_key(Config(cluster_secret_file=secret, cluster_advertise="10.0.0.5:9181"))
    secret.chmod(0o640)
    shared = channel_key(Config(cluster_secret_file=secret, cluster_advertise="10.0.0.5:9181"))
    assert shared == channel_key(Config(cluster_secret_file=str(secret), data_dir=tmp_path / "elsewhere"))
    secret.write_text("short")
    with pytest.raises(ConfigError, match="shorter than 32"):
        channel_key(Config(cluster_secret_file=secret))
    with pytest.raises(ConfigError, match="cannot read"):
        channel_key(Config(cluster_secret_file=tmp_path / "missing"))


def test_only_registered_types_cross_and_a_program_module_never_registers():
    import types

    from coordinator.crossable import WIRE_TYPES, crossing
    from coordinator.service import Coordinator

    assert "coordinator.iceberg.proposals:CommitTable" in WIRE_TYPES   # each format registers its own
    assert not [name for name in WIRE_TYPES if "__main__" in name]
    with pytest.raises(ValueError, match="run as a program"):
        crossing(types.ModuleType("coordinator.uniform.__main__"))
    with pytest.raises(TypeError, match="cannot cross"):
        Codec({}).dumps(Coordinator.__new__(Coordinator))   # a class of ours, but no wire type: never sent
    for name in ("coordinator.service:Coordinator", "coordinator.uniform.__main__:main", "storage.embedded:EmbeddedPostgres"):
        with pytest.raises(WireError, match="not a type that crosses"):
            Codec({}).loads(msgpack.packb([msgpack.ExtType(wire._OBJECT, name.encode()), {}]))


def test_an_error_of_a_class_that_does_not_cross_arrives_as_the_nearest_that_does():
    class Unlisted(Unavailable):
        pass
    back = Codec({}).loads(Codec({}).dumps(Unlisted("busy", retry_after_s=3)))
    assert type(back) is Unavailable and back.message == "busy" and back.retry_after_s == 3 and back.status == 503
