"""The one write of an answer: a response's head held for the first part of its body.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the
body at ``http.response.body``: two ``write`` calls, so two TCP segments and two wake-ups of the
client for every answer. Here the head is formatted as uvicorn formats it but held until the body
comes, and both go out in one ``writelines`` (one ``writev`` on uvloop, the body not copied):
one wake-up of the client an answer, at no more CPU a request than uvicorn's two writes
(docs/benchmarks.md, ``bench.floor --stacks``).

The protocol (app/connection.py) builds each request's cycle (``Cycle``, app/cycle.py) with a
transport of its own, ``HeadHeld``, which tells the head by the cycle's ``response_started``
(set just before the cycle writes it), so no message the app sends passes through a second
``send`` (one a message cost about 10 us a request there).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class HeadHeld:
    """A cycle's transport: the response's head (uvicorn's one write at ``http.response.start``)
    waits for the next write, the body's, and both go out in one ``writelines`` (with
    ``Connection: close`` added where the request's body will never come: ``Expect:
    100-continue`` answered before it was asked for); a head with
    nothing written after it (HEAD, an empty body) goes when the response completes
    (``done``, the cycle's ``on_response``) or the connection closes. What the cycle writes
    once its connection is closing is dropped: its client is gone, or the connection was
    closed under it (a 400 for a request pipelined after it, a 408), and a write to the closed
    socket would raise. Anything else goes to the real transport."""

    __slots__ = ("transport", "cycle", "on_response", "head", "expecting")

    def __init__(self, transport: Any, cycle: RequestResponseCycle) -> None:
        self.transport = transport
        # Till the head comes (the first write once the response has started). Let go then:
        # the cycle holds this, and a reference cycle a request would leave every request to
        # the garbage collector (3-4 us a request more, measured in-process).
        self.cycle: RequestResponseCycle | None = cycle
        self.on_response = cycle.on_response
        self.head: bytes | None = None
        # The request's client waits for ``100 Continue`` before it sends the body
        # (``Expect: 100-continue``), and none has been sent. An HTTP/1.0 client knows no 1xx
        # answer and would take one for its answer: its expectation is ignored (RFC 9110,
        # 10.1.1), so uvicorn sends none.
        if cycle.scope["http_version"] == "1.0":
            cycle.waiting_for_100_continue = False
        self.expecting: bool = cycle.waiting_for_100_continue

    def write(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self.cycle = None
            if self.expecting and cycle.more_body and cycle.keep_alive:
                # Answered before the body its client waits to send: the client sends none,
                # and a connection read on would take its next request for that body. Closed
                # after the answer, which says so (RFC 9110, 10.1.1); uvicorn's head ends in
                # its blank line.
                cycle.keep_alive = False
                data = data[:-2] + b"connection: close\r\n\r\n"
            self.head = data
            return
        if cycle is not None:  # before the head: uvicorn's ``100 Continue``
            self.expecting = False
        head, self.head = self.head, None
        transport = self.transport
        if transport.is_closing():
            return
        if head is None:
            transport.write(data)
        else:
            transport.writelines([head, data])  # uvloop: one writev, the body not copied

    def flush(self) -> None:
        head, self.head = self.head, None
        if head is not None and not self.transport.is_closing():
            self.transport.write(head)

    def done(self) -> None:
        self.flush()
        self.on_response()

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)
