"""A TCP proxy between a client and PostgreSQL on loopback that can misbehave the way a dying network or server
does, at a moment a test chooses: so that the client library raises its real errors against a real server."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import unquote, urlsplit, urlunsplit


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `upstream`: a port on 127.0.0.1, or a Unix socket's path (the embedded
    PostgreSQL listens only there; `for_database` picks it from a URL). Three faults, each armed by a flag:

    - `refuse`: new connections are closed at once, as by a server that is down;
    - `hold_close`: when the server closes a connection, its last bytes (a FATAL) still reach the client, but the
      client's socket stays open, as when the close is not yet read;
    - `cut_next`: the client's next bytes reach the server, but no reply reaches the client, whose connection is
      then closed (`cut_delay_s` later, after the server has run what it got): a reply lost in flight.
    """

    def __init__(self, upstream: int | str, *, cut_delay_s: float = 0.5):
        self.upstream = upstream
        self.cut_delay_s = cut_delay_s
        self.refuse = False
        self.hold_close = False
        self.cut_next = False
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def for_database(cls, database_url: str, **kwargs) -> tuple["TcpProxy", str]:
        """A proxy to the server of `database_url`, and the URL that reaches the same database through it."""
        p = urlsplit(database_url)
        host = unquote(p.netloc.rpartition("@")[2].rpartition(":")[0])
        proxy = cls(f"{host}/.s.PGSQL.{p.port}" if host.startswith("/") else p.port, **kwargs)
        return proxy, urlunsplit(p._replace(netloc=f"{p.username}@127.0.0.1:{proxy.port}"))

    def _dial(self) -> socket.socket:
        if isinstance(self.upstream, str):
            server = socket.socket(socket.AF_UNIX)
            server.connect(self.upstream)
            return server
        return socket.create_connection(("127.0.0.1", self.upstream))

    def close(self) -> None:
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                _shut(client)
                continue
            server = self._dial()
            self._sockets += [client, server]
            muted = threading.Event()
            threading.Thread(target=self._to_server, args=(client, server, muted), daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client, muted), daemon=True).start()

    def _to_server(self, client: socket.socket, server: socket.socket, muted: threading.Event) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                _shut(server)
                return
            cut, self.cut_next = self.cut_next, False
            if cut:
                muted.set()
            try:
                server.sendall(data)
            except OSError:
                return
            if cut:
                self.cuts += 1
                time.sleep(self.cut_delay_s)
                _shut(client)
                _shut(server)
                return

    def _to_client(self, server: socket.socket, client: socket.socket, muted: threading.Event) -> None:
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                data = b""
            if not data:
                if not self.hold_close:
                    _shut(client)
                return
            if not muted.is_set():
                try:
                    client.sendall(data)
                except OSError:
                    return


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
