"""A relay on 127.0.0.1 that adds latency: what a client sends reaches the server
`delay_ms` later, as if the server sat in another zone; what the server answers is
passed on at once. In front of an HTTP server every request waits `delay_ms` before it
is forwarded (on a keep-alive connection the next request is sent after the answer,
and waits again).

  with LatencyProxy(("127.0.0.1", emulator_port), delay_ms=50) as proxy:
    ...  # point the client at proxy.endpoint

One thread (a daemon) runs a selector loop over every connection, so the relay costs
little CPU per request (a thread pair per connection cost about 150 us a request here,
as much as the emulator itself). Bounded: at most `max_connections` at once (more are
closed at accept), at most BUFFER bytes held per direction of a connection (the
server is not read while its client lags). Loopback only, both ends. It stops when the
`with` block ends (close()), and cannot outlive the process that started it.
"""

from __future__ import annotations

import heapq
import itertools
import selectors
import socket
import threading
import time

LOOPBACK = "127.0.0.1"
BUFFER = 4 << 20  # bytes held for one direction of a connection at most
_RECV = 1 << 16
_TICK = 0.2  # seconds the loop sleeps at most (to notice close())


class _Pair:
  """A client connection and its upstream one, with the bytes each still has to send."""

  def __init__(self, client: socket.socket, server: socket.socket):
    self.client, self.server = client, server
    self.out = {client: bytearray(), server: bytearray()}
    self.held = 0  # client bytes waiting for their time
    self.closed = False

  def peer(self, sock: socket.socket) -> socket.socket:
    return self.server if sock is self.client else self.client


class LatencyProxy:
  """A relay on 127.0.0.1:<free port> to `upstream` (a loopback (host, port)), holding
  every byte a client sends `delay_ms` before forwarding it."""

  def __init__(self, upstream: tuple[str, int], delay_ms: float, max_connections: int = 1024):
    if upstream[0] != LOOPBACK:
      raise ValueError(f"upstream {upstream[0]}: the relay serves loopback only")
    self.upstream, self.delay_s, self.max_connections = upstream, delay_ms / 1000, max_connections
    self._listener = socket.create_server((LOOPBACK, 0), backlog=256)
    self._listener.setblocking(False)
    self.endpoint = f"http://{LOOPBACK}:{self._listener.getsockname()[1]}"
    self._selector = selectors.DefaultSelector()
    self._selector.register(self._listener, selectors.EVENT_READ)
    self._pairs: set[_Pair] = set()
    self._due: list = []  # heap of (due time, seq, pair, bytes)
    self._seq = itertools.count()
    self._closed = False
    self.connections = self.peak_connections = self.refused = 0
    self._thread = threading.Thread(target=self._loop, daemon=True, name="latency-proxy")
    self._thread.start()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def cpu_s(self) -> float:
    """CPU seconds the relay's thread has used (while it runs)."""
    return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

  def close(self) -> None:
    """Stops the loop, which closes every connection and the listener."""
    self._closed = True
    self._thread.join(timeout=5)

  def _loop(self) -> None:
    try:
      while not self._closed:
        wait = min(_TICK, self._due[0][0] - time.monotonic()) if self._due else _TICK
        for key, mask in self._selector.select(max(wait, 0)):
          if key.fileobj is self._listener:
            self._accept()
          else:
            self._ready(key.data, key.fileobj, mask)
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
          _, _, pair, data = heapq.heappop(self._due)
          pair.held -= len(data)
          self._send(pair, pair.server, data)
    finally:
      for pair in list(self._pairs):
        self._drop(pair)
      self._selector.close()
      self._listener.close()

  def _accept(self) -> None:
    try:
      client, _ = self._listener.accept()
    except BlockingIOError:
      return
    if len(self._pairs) >= self.max_connections:
      self.refused += 1
      client.close()
      return
    try:
      server = socket.create_connection(self.upstream, timeout=5)
    except OSError:
      self.refused += 1
      client.close()
      return
    pair = _Pair(client, server)
    for sock in (client, server):
      sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      sock.setblocking(False)
      self._selector.register(sock, selectors.EVENT_READ, pair)
    self._pairs.add(pair)
    self.connections += 1
    self.peak_connections = max(self.peak_connections, len(self._pairs))

  def _ready(self, pair: _Pair, sock: socket.socket, mask: int) -> None:
    if mask & selectors.EVENT_WRITE:
      self._send(pair, sock, b"")
    if pair.closed or not mask & selectors.EVENT_READ:
      return
    try:
      data = sock.recv(_RECV)
    except (BlockingIOError, InterruptedError):
      return
    except OSError:
      data = b""
    if not data:
      self._drop(pair)
    elif sock is pair.client:  # a request: due delay_s from now
      pair.held += len(data)
      heapq.heappush(self._due, (time.monotonic() + self.delay_s, next(self._seq), pair, data))
      self._watch(pair, sock)
    else:  # an answer: at once
      self._send(pair, pair.client, data)

  def _send(self, pair: _Pair, sock: socket.socket, data: bytes) -> None:
    """Queues `data` for `sock` and sends what the socket takes now."""
    if pair.closed:
      return
    out = pair.out[sock]
    out += data
    try:
      sent = sock.send(out) if out else 0
    except (BlockingIOError, InterruptedError):
      sent = 0
    except OSError:
      self._drop(pair)
      return
    del out[:sent]
    for s in (pair.client, pair.server):
      self._watch(pair, s)

  def _watch(self, pair: _Pair, sock: socket.socket) -> None:
    """Reads `sock` unless its peer's buffer (for a client: its held bytes) is full; waits
    for it to take more while it has bytes to send; neither: off the selector."""
    full = pair.held if sock is pair.client else len(pair.out[pair.peer(sock)])
    mask = (selectors.EVENT_READ if full < BUFFER else 0)
    mask |= selectors.EVENT_WRITE if pair.out[sock] else 0
    keys = self._selector.get_map()
    if sock not in keys:
      if mask:
        self._selector.register(sock, mask, pair)
    elif not mask:
      self._selector.unregister(sock)
    elif keys[sock].events != mask:
      self._selector.modify(sock, mask, pair)

  def _drop(self, pair: _Pair) -> None:
    if pair.closed:
      return
    pair.closed = True
    self._pairs.discard(pair)
    for sock in (pair.client, pair.server):
      if sock in self._selector.get_map():
        self._selector.unregister(sock)
      try:
        sock.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
      sock.close()
