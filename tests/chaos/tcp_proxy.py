"""A small TCP proxy for the chaos suite: one per beat replica, between it and its broker.

Each :class:`Proxy` listens on ``127.0.0.1:<free port>`` and forwards every connection to one
target (a Redis server). All proxies of a :class:`ProxyHub` run on one asyncio loop in a daemon
thread; the test thread steers them with thread-safe calls. A :class:`Trap` armed on some
proxies fires once, on the ``nth`` (default first) client->server read of a proxy that
contains its ``marker`` (for Redis, ``b"\\r\\nLPUSH\\r\\n"``: a publish), over whichever of
those proxies gets there first, and then does one of two things:

``HOLD`` (a broker write that stalls)
    That read and every later client->server byte of that proxy, on every connection
    (including connections opened while holding), is kept in the proxy, in order, not sent.
    The proxy goes on reading from the client, so the client's writes complete: to the client
    the bytes are on the wire, it waits for a reply that does not come. Server->client bytes
    still flow. :meth:`Proxy.release` sends what was held, in order, and forwards normally
    from then on. **Held bytes are delivered even if the client gave up and closed its
    connection meanwhile**: the proxy closes that connection's upstream side only after it
    has written them, so the server executes a write its client abandoned (the worst case
    of a stalled network path: the bytes were accepted by the path, they arrive late). The
    server's replies to them are discarded.

``CUT`` (the connection lost in the middle of a write)
    The marked read is dropped and the connection is closed on both sides at once: the broker
    gets the bytes before it and never the rest, the client sees its connection reset.

``KILL_AFTER_REPLY`` (death between the broker's acceptance and the mark)
    The marked read and the rest of the write are forwarded; the first server->client bytes
    after it (the server's reply: the broker executed the write) are swallowed, and the
    trap's ``action`` runs (it SIGKILLs the replica). So the broker has the messages and the
    replica never learns it.

Nothing here knows Redis beyond the marker: the proxy moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: The start of a Redis LPUSH command in RESP (redis-py sends command names upper case).
LPUSH = b"\r\nLPUSH\r\n"
#: An AMQP 0-9-1 Basic.Publish method: class 60, method 40.
BASIC_PUBLISH = b"\x00\x3c\x00\x28"
READ_SIZE = 1 << 16


class Mode(enum.Enum):
    HOLD = "hold"
    CUT = "cut"
    KILL_AFTER_REPLY = "kill_after_reply"


@dataclass
class Trap:
    """Fires once, on the first client->server read containing ``marker`` over the proxies it
    is armed on. ``action(proxy_name)`` runs in the proxy thread (``KILL_AFTER_REPLY``)."""

    marker: bytes
    mode: Mode
    action: Callable[[str], None] | None = None
    #: Fire on the ``nth`` marked read of a proxy (the earlier ones pass untouched).
    nth: int = 1
    fired: threading.Event = field(default_factory=threading.Event)
    #: Set once the reply was swallowed and ``action`` ran (``KILL_AFTER_REPLY``).
    acted: threading.Event = field(default_factory=threading.Event)
    #: The proxy it fired on, and when (``time.time()``) the marked read arrived.
    fired_by: str | None = None
    fired_at: float | None = None
    #: When the reply was swallowed and ``action`` ran (``KILL_AFTER_REPLY``).
    acted_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: dict[str, int] = field(default_factory=dict)

    def take(self, proxy: str, window: bytes) -> bool:
        if self.marker not in window:
            return False
        with self._lock:
            self._seen[proxy] = self._seen.get(proxy, 0) + 1
            if self.fired_by is not None or self._seen[proxy] < self.nth:
                return False
            self.fired_by, self.fired_at = proxy, time.time()
        self.fired.set()
        return True


class _Conn:
    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.creader, self.cwriter = client
        self.sreader, self.swriter = server
        self.held: list[bytes] = []
        self.client_done = False
        #: A KILL_AFTER_REPLY trap waiting for the server's reply on this connection.
        self.awaiting: Trap | None = None
        self.swallow = False
        #: A CUT trap fired: both sides are closed, the rest of the write never sent.
        self.cut = False


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``target``; see the module docstring for the traps."""

    def __init__(self, hub: ProxyHub, name: str, target: tuple[str, int]) -> None:
        self.hub = hub
        self.name = name
        self.target = target
        self.port = 0
        self.holding = False
        self.trap: Trap | None = None
        self.held_bytes = 0
        self.connections = 0
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, scheme: str = "redis", path: str = "/0") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def arm(self, trap: Trap) -> None:
        self.hub.call(self._set_trap, trap)

    def _set_trap(self, trap: Trap | None) -> None:
        self.trap = trap

    def release(self) -> int:
        """Stop holding: send the held bytes (even of closed clients), return how many."""
        return int(self.hub.run(self._release()))

    async def _release(self) -> int:
        self.holding = False
        sent = 0
        for conn in list(self._conns):
            held, conn.held = conn.held, []
            try:
                for data in held:
                    conn.swriter.write(data)
                    sent += len(data)
                await conn.swriter.drain()
            except ConnectionError:
                pass
            if conn.client_done:
                _close(conn.swriter)
        return sent

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            server = await asyncio.open_connection(*self.target)
        except OSError:
            _close(cwriter)
            return
        conn = _Conn((creader, cwriter), server)
        self._conns.add(conn)
        self.connections += 1
        try:
            await asyncio.gather(self._up(conn), self._down(conn))
        finally:
            self._conns.discard(conn)

    async def _up(self, conn: _Conn) -> None:
        tail = b""
        try:
            while data := await conn.creader.read(READ_SIZE):
                window, tail = tail + data, (tail + data)[-32:]
                trap = self.trap
                if not self.holding and trap is not None and trap.take(self.name, window):
                    self.trap = None
                    if trap.mode is Mode.CUT:
                        conn.cut = True
                        trap.acted_at = time.time()
                        trap.acted.set()
                        break
                    if trap.mode is Mode.HOLD:
                        self.holding = True
                    else:
                        conn.awaiting = trap
                if self.holding:
                    conn.held.append(data)
                    self.held_bytes += len(data)
                    continue
                conn.swriter.write(data)
                await conn.swriter.drain()
        except ConnectionError:
            pass
        conn.client_done = True
        if conn.cut:
            _close(conn.cwriter)
        if not conn.held:
            _close(conn.swriter)

    async def _down(self, conn: _Conn) -> None:
        try:
            while data := await conn.sreader.read(READ_SIZE):
                trap, conn.awaiting = conn.awaiting, None
                if trap is not None:
                    conn.swallow = True
                    trap.acted_at = time.time()
                    if trap.action is not None:
                        trap.action(self.name)
                    trap.acted.set()
                if conn.swallow:
                    continue
                conn.cwriter.write(data)
                await conn.cwriter.drain()
        except ConnectionError:
            pass
        _close(conn.cwriter)
        if not conn.held:
            _close(conn.swriter)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            _close(conn.cwriter)
            _close(conn.swriter)


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


class ProxyHub:
    """The loop thread of a test's proxies; :meth:`close` stops them all."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxies: dict[str, Proxy] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def add(self, name: str, target: tuple[str, int]) -> Proxy:
        proxy = Proxy(self, name, target)
        self.run(proxy._start())
        self.proxies[name] = proxy
        return proxy

    def run(self, coro: object) -> object:
        """Run a coroutine on the hub's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)  # type: ignore[arg-type]

    def call(self, fn: Callable[..., None], *args: object) -> None:
        async def call() -> None:
            fn(*args)

        self.run(call())

    def arm(self, trap: Trap, *names: str) -> None:
        """Arm ``trap`` on the proxies ``names`` (all when none given): it fires once."""
        for name in names or list(self.proxies):
            self.proxies[name].arm(trap)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            for proxy in self.proxies.values():
                self.run(proxy._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
