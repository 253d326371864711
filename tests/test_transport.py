"""api/transport.py's corrections, on real hypercorn over loopback, with whichever quart-trio line is installed.

The keep-alive timer: an idle connection is closed after the keep-alive timeout, counted from its last response; a
request longer than the timeout is not cut off; and a connection the client closed ends its tasks at once
(hypercorn's own timer held them until the timeout). The lingering body: a body over the limit is read to its end
before the 413, which then leaves the connection usable. Slow clients (slowloris) and the disconnect handling are
tested through the whole service in tests/test_hostile_input.py."""

from __future__ import annotations

import re
import time

import pytest
import trio
from hypercorn.trio import serve
from quart import Response, request
from quart_trio import QuartTrio

from api.transport import ConnectionLimit, HTTPConnection, Request, ServerConfig, use_transport
from loadtest.attacks.front_door import H2Client

KEEP_ALIVE_S = 1.0
MAX_BODY = 1000


def tiny_app() -> QuartTrio:
    app = QuartTrio(__name__)
    app.asgi_http_class = HTTPConnection
    app.request_class = Request
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY

    @app.get("/ping")
    async def ping() -> Response:
        return Response(b"pong")

    @app.get("/slow")
    async def slow() -> Response:
        await trio.sleep(KEEP_ALIVE_S * 1.5)
        return Response(b"done")

    @app.post("/echo")
    async def echo() -> Response:
        return Response(await request.get_data())

    @app.post("/refuse")
    async def refuse() -> Response:   # as the access check refuses: without reading the body
        return Response(b"no", status=401)

    return app


def hyper_config(keep_alive_s: float, max_connections: int | None = None) -> ServerConfig:
    config = ServerConfig()
    config.bind = ["127.0.0.1:0"]
    config.keep_alive_timeout = keep_alive_s
    config.graceful_timeout = 30
    config.accesslog = None
    if max_connections is not None:
        config.connections = ConnectionLimit(max_connections)
    return config


async def start(nursery, config: ServerConfig, shutdown: trio.Event | None = None) -> tuple[str, int]:
    use_transport()
    trigger = shutdown.wait if shutdown is not None else None
    binds = await nursery.start(lambda task_status: serve(tiny_app(), config, shutdown_trigger=trigger,
                                                          task_status=task_status))
    host, port = binds[0].removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@pytest.fixture
async def server(nursery):
    return await start(nursery, hyper_config(KEEP_ALIVE_S))


async def get(stream: trio.SocketStream, path: str) -> bytes:
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return await receive_answer(stream)


async def receive_answer(stream: trio.SocketStream) -> bytes:
    """One whole response (Quart's all have a Content-Length)."""
    answer = b""
    while True:
        head, end_of_head, body = answer.partition(b"\r\n\r\n")
        if end_of_head and len(body) >= int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)[1]):
            return answer
        chunk = await stream.receive_some(65536)
        assert chunk, f"the server closed the connection after {answer!r}"
        answer += chunk


async def closed_within(stream: trio.SocketStream, seconds: float) -> float | None:
    """Seconds until the server closes `stream` (None: still open after `seconds`)."""
    started = time.monotonic()
    with trio.move_on_after(seconds):
        while await stream.receive_some(65536):
            pass
        return time.monotonic() - started
    return None


def count_tasks() -> int:
    def walk(task) -> int:
        return 1 + sum(walk(child) for nursery in task.child_nurseries for child in nursery.child_tasks)
    return walk(trio.lowlevel.current_root_task())


async def test_idle_deadline_counts_from_the_last_response(server):
    stream = await trio.open_tcp_stream(*server)
    # Requests every 0.6 s for 2.4 s: past the first request's deadline, but never 1 s idle.
    for _ in range(5):
        assert (await get(stream, "/ping")).startswith(b"HTTP/1.1 200")
        await trio.sleep(KEEP_ALIVE_S * 0.6)
    elapsed = await closed_within(stream, KEEP_ALIVE_S * 5)
    assert elapsed is not None, "an idle connection was not closed"
    assert elapsed < KEEP_ALIVE_S * 2, elapsed


async def test_a_request_longer_than_the_timeout_is_answered(server):
    stream = await trio.open_tcp_stream(*server)
    assert (await get(stream, "/slow")).endswith(b"done")
    assert (await get(stream, "/ping")).endswith(b"pong")  # and the connection is still usable


async def test_a_closed_connection_ends_its_tasks_at_once(server):
    before = count_tasks()
    streams = [await trio.open_tcp_stream(*server) for _ in range(5)]
    for stream in streams:
        await get(stream, "/ping")
    assert count_tasks() > before
    for stream in streams:
        await stream.aclose()
    with trio.move_on_after(KEEP_ALIVE_S / 2):  # well before any keep-alive deadline
        while count_tasks() > before:
            await trio.sleep(0.01)
    assert count_tasks() == before, "the connections' tasks outlived the connections"


@pytest.mark.parametrize("max_connections", [None, 10])
async def test_shutdown_closes_idle_connections_and_lets_requests_finish(max_connections):
    shutdown = trio.Event()
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:  # exits once hypercorn's graceful shutdown is done
            address = await start(nursery, hyper_config(60, max_connections), shutdown)
            idle = await trio.open_tcp_stream(*address)
            await get(idle, "/ping")
            silent = await trio.open_tcp_stream(*address)   # never sends anything
            busy = await trio.open_tcp_stream(*address)
            await busy.send_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            await trio.sleep(0.1)
            shutdown.set()
            # The idle connections go at once; the busy one gets its answer, then is closed.
            assert await closed_within(idle, 5) is not None, "an idle connection outlived the shutdown"
            assert await closed_within(silent, 5) is not None, "a connection that sent nothing outlived the shutdown"
            answer = b""
            while chunk := await busy.receive_some(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"done"), answer


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_is_read_to_its_end_before_the_413(server, chunked):
    """HTTP clients send the whole body before they read the answer: a 413 sent (and the connection closed) while
    they still send reaches them as a connection reset. The answer waits for the body's end, even when its
    Content-Length already says it is too long, and the connection then serves the next request."""
    stream = await trio.open_tcp_stream(*server)
    size = MAX_BODY * 5
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    await stream.send_all(f"POST /echo HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode())
    parts = [b"x" * (size // 5)] * 5
    for part in parts[:-1]:
        await stream.send_all(b"%x\r\n%b\r\n" % (len(part), part) if chunked else part)
    with trio.move_on_after(0.5):
        early = await stream.receive_some(65536)
        pytest.fail(f"answered before the body's end: {early[:40]!r}")
    last = parts[-1]
    await stream.send_all(b"%x\r\n%b\r\n0\r\n\r\n" % (len(last), last) if chunked else last)
    with trio.fail_after(5):
        answer = await receive_answer(stream)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        assert (await get(stream, "/ping")).endswith(b"pong")


async def test_a_body_within_the_limit_is_read_whole(server):
    stream = await trio.open_tcp_stream(*server)
    body = b"y" * MAX_BODY
    await stream.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    with trio.fail_after(5):
        assert (await receive_answer(stream)).startswith(b"HTTP/1.1 200")


async def test_a_body_is_not_read_unless_the_app_asks_for_it(server):
    """Answered without its body (as a request refused before its body is read), a request's answer comes at
    once, says `Connection: close`, and the connection then closes: nothing of its body waits to be read, and
    nothing of the connection is left behind."""
    before = count_tasks()
    stream = await trio.open_tcp_stream(*server)
    await stream.send_all(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (100 << 20))
    await stream.send_all(b"x" * (256 << 10))   # of 100 MiB
    with trio.fail_after(5):
        answer = await receive_answer(stream)
        assert answer.startswith(b"HTTP/1.1 401") and b"\r\nconnection: close\r\n" in answer.lower(), answer
        while True:
            try:
                if not await stream.receive_some(65536):
                    break
            except trio.BrokenResourceError:   # reset: the rest of the body was never read
                break
        while count_tasks() > before:
            await trio.sleep(0.01)


async def test_an_http2_stream_answered_early_is_reset_and_its_connection_goes_on(server):
    """Over HTTP/2 the answer comes after a flow-control window or so of a 100 MiB body, the stream is then reset
    (RFC 9113 8.1, NO_ERROR), and the connection serves the next request; what the client had sent meanwhile is
    dropped (hypercorn's own looked the stream up again and ended the whole server)."""
    def use() -> list:
        client = H2Client(f"http://{server[0]}:{server[1]}")
        try:
            return [client.request("POST", "/refuse", 100 << 20), client.request("GET", "/ping"),
                    client.request("POST", "/refuse", 100 << 20), client.request("POST", "/echo", 500)]
        finally:
            client.close()
    with trio.fail_after(30):
        (refused, sent), (pinged, _), (again, _), (echoed, _) = await trio.to_thread.run_sync(use)
    assert (refused, pinged, again, echoed) == (401, 200, 401, 200)
    assert sent < 1 << 20, sent


async def test_past_the_connection_maximum_an_idle_connection_makes_room(nursery):
    """The oldest connection that never sent a request goes first, then the one idle longest; a busy one stays,
    and when every one is busy the new one is closed at once."""
    config = hyper_config(60, max_connections=3)
    address = await start(nursery, config)
    served = await trio.open_tcp_stream(*address)
    assert (await get(served, "/ping")).endswith(b"pong")
    first, second = await trio.open_tcp_stream(*address), await trio.open_tcp_stream(*address)
    third = await trio.open_tcp_stream(*address)   # one too many: the oldest that never sent a request goes
    assert await closed_within(first, 2) is not None
    assert await closed_within(second, 0.2) is None and await closed_within(served, 0.2) is None
    for stream in (second, third):   # now all have been served
        assert (await get(stream, "/ping")).endswith(b"pong")
    newest = await trio.open_tcp_stream(*address)   # the one idle longest goes: `served`
    assert await closed_within(served, 2) is not None
    assert config.connections.closed_at_limit == 2
    busy = (second, third, newest)
    for stream in busy:
        await stream.send_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    await trio.sleep(0.2)
    refused = await trio.open_tcp_stream(*address)
    assert await closed_within(refused, 2) is not None
    assert config.connections.closed_at_limit == 3
    for stream in busy:
        assert (await receive_answer(stream)).endswith(b"done")


async def test_a_connection_that_sends_nothing_holds_one_task_until_the_header_deadline(nursery):
    """Under a connection limit (the service always has one), hypercorn sets a connection up only when its first
    bytes arrive: until then it is one task and a socket, which is all a flood of silent connections makes the
    service set up and tear down. The header deadline runs from the connect all the same."""
    address = await start(nursery, hyper_config(KEEP_ALIVE_S, max_connections=50))
    warm = await trio.open_tcp_stream(*address)   # (the server's one task of its own starts with a connection)
    assert (await get(warm, "/ping")).endswith(b"pong")
    await warm.aclose()
    await trio.sleep(0.1)
    before = count_tasks()
    silent = [await trio.open_tcp_stream(*address) for _ in range(20)]
    await trio.sleep(0.2)
    assert count_tasks() - before == len(silent)
    late = await trio.open_tcp_stream(*address)
    await trio.sleep(KEEP_ALIVE_S * 0.7)
    await late.send_all(b"GET /ping HTTP/1.1\r\n")   # the request starts late, and its headers trickle
    started = time.monotonic()
    elapsed = await closed_within(late, KEEP_ALIVE_S * 2)
    assert elapsed is not None and time.monotonic() - started < KEEP_ALIVE_S * 0.7, elapsed
    for stream in silent:
        assert await closed_within(stream, KEEP_ALIVE_S) is not None
    await trio.sleep(0.1)
    assert count_tasks() == before


async def test_past_the_connection_maximum_an_address_holding_most_connections_makes_room(nursery):
    """Past the maximum (4 here), an address holding more than half of the connections gives up its own idle
    ones, for others' new connections and for its own; those of the others stay, though idle longer."""
    config = hyper_config(60, max_connections=4)
    address = await start(nursery, config)
    other = await trio.open_tcp_stream(*address)   # from 127.0.0.1, idle longest
    assert (await get(other, "/ping")).endswith(b"pong")
    heavy = [await trio.open_tcp_stream(*address, local_address="127.0.0.2") for _ in range(3)]
    for stream in heavy:
        assert (await get(stream, "/ping")).endswith(b"pong")
    newcomer = await trio.open_tcp_stream(*address, local_address="127.0.0.3")
    assert await closed_within(heavy[0], 2) is not None   # the heavy address's idle longest
    assert (await get(newcomer, "/ping")).endswith(b"pong")
    more = await trio.open_tcp_stream(*address, local_address="127.0.0.2")   # at its share: room from its own
    assert await closed_within(heavy[1], 2) is not None
    assert (await get(more, "/ping")).endswith(b"pong")
    assert await closed_within(other, 0.2) is None
    assert (await get(other, "/ping")).endswith(b"pong")
    assert config.connections.closed_at_limit == 2
