"""uvicorn's httptools protocol, writing a response's head and the first part of its body at once.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the
body at ``http.response.body``: two ``write`` calls, so two TCP segments and two wake-ups of the
client for every answer. Here the head is formatted by uvicorn as usual but held until the body
comes, and both go out in one ``writelines`` (one ``writev`` on uvloop, the body not copied). In
a closed loop of eight clients on `mlp` that took 110-150 us off each round of eight answers
(docs/benchmarks.md).

uvicorn builds a request's ``RequestResponseCycle`` inside ``on_headers_complete``; the protocol
re-classes that one object as ``OneWriteCycle`` (which adds no state of its own) rather than
copying the method. ``batchserve serve`` passes ``OneWriteProtocol`` to uvicorn as its ``http``
implementation; ``uvicorn --factory app.main:create_app`` runs with uvicorn's own.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle


class _Held:
    """Stands in for the transport while uvicorn formats one message: keeps what it writes (after
    ``head``, a head held from before) until ``flush``; a close flushes first, so the bytes and
    the close reach the socket in uvicorn's order. Anything else goes to the real transport."""

    def __init__(self, transport: Any, head: bytes | None) -> None:
        self.transport = transport
        self.parts = [head] if head else []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def flush(self) -> None:
        if self.parts:
            parts, self.parts = self.parts, []
            self.transport.writelines(parts)  # uvloop: one writev, the body not copied

    def close(self) -> None:
        self.flush()
        self.closed = True
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class OneWriteCycle(RequestResponseCycle):
    """A request's cycle whose response head waits for the first body message."""

    _head: bytes | None = None

    async def send(self, message: Any) -> None:
        if self.disconnected:  # uvicorn drops what is sent to a gone client: the head too
            self._head = None
            await super().send(message)
            return
        real = self.transport
        held = _Held(real, self._head)
        self._head = None
        if self.flow.write_paused:  # uvicorn's send waits for the client: nothing to join
            held.flush()
            await super().send(message)
            return
        self.transport = held  # type: ignore[assignment]  # a stand-in for its writes
        try:  # does not suspend: the flow is not paused
            await super().send(message)
        except BaseException:
            held.flush()  # what uvicorn wrote before it raised, as it would have gone out
            raise
        finally:
            self.transport = real
        if message["type"] == "http.response.start" and not held.closed:
            self._head = b"".join(held.parts)
        else:
            held.flush()


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``OneWriteCycle`` for every request."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if type(self.cycle) is RequestResponseCycle:
            self.cycle.__class__ = OneWriteCycle
