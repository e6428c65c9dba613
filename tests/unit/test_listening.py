"""app/listening.py: the server's listening socket and one for each front end in a
SO_REUSEPORT group, so the kernel spreads new connections over the front ends; the device
process's private socket."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from app.errors import ConfigError
from app.listening import dual_stack, for_frontends, listening_socket


def reuses_port(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT))


@contextmanager
def closing_all(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        for sock in set(socks):
            stack.enter_context(sock)
        yield socks


def accepted(socks: list[socket.socket]) -> list[int]:
    """How many connections wait in each socket's queue (each accepted and closed here)."""
    counts = []
    for sock in socks:
        sock.setblocking(False)
        n = 0
        while True:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                break
            conn.close()
            n += 1
        counts.append(n)
    return counts


def test_a_group_spreads_new_connections_over_every_front_ends_socket() -> None:
    """Four front ends' sockets on one address: 64 connections made one after another (as a
    load generator's pool opens them) reach all four, none with fewer than 4 (the kernel picks
    by the connection's addresses: an even spread would give 16 each; fewer than 4 happens
    about once in ten thousand runs). One socket shared would leave it to the front ends'
    wake-ups, which gave one 13 and another 144 of 256 (docs/frontends.md)."""
    sock = listening_socket("127.0.0.1", 0, None, group=True)
    with closing_all(for_frontends(sock, 4)) as socks:
        assert len(set(socks)) == 4 and socks[0] is sock
        assert {s.getsockname() for s in socks} == {sock.getsockname()}
        assert all(reuses_port(s) for s in socks)
        clients = [socket.create_connection(sock.getsockname()) for _ in range(64)]
        try:
            counts = accepted(socks)
        finally:
            for client in clients:
                client.close()
        assert sum(counts) == 64 and min(counts) >= 4, counts


def test_an_inherited_socket_bound_with_reuseport_gets_siblings() -> None:
    """A socket passed with --fd joins the group when it was bound with SO_REUSEPORT."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    inherited = listening_socket("127.0.0.1", 9, sock.detach(), group=True)  # the port is not used
    with closing_all(for_frontends(inherited, 2)) as socks:
        assert len(set(socks)) == 2
        assert socks[1].getsockname() == inherited.getsockname()


def test_an_inherited_socket_without_reuseport_is_shared(
        caplog: pytest.LogCaptureFixture) -> None:
    plain = socket.create_server(("127.0.0.1", 0))
    with caplog.at_level(logging.INFO, logger="batchserve"), \
            closing_all(for_frontends(plain, 3)) as socks:
        assert socks == [plain, plain, plain]
    assert "share one listening socket" in caplog.text


def test_one_front_end_or_one_process_gets_the_socket_as_it_is() -> None:
    sock = listening_socket("127.0.0.1", 0, None, group=False)
    with closing_all(for_frontends(sock, 1)) as socks:
        assert socks == [sock] and not reuses_port(sock)


def v6_only(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))


def test_only_the_ipv6_wildcard_is_bound_for_both_families() -> None:
    assert dual_stack("::") is dual_stack("0:0:0:0:0:0:0:0") is socket.has_dualstack_ipv6()
    assert not any(dual_stack(host) for host in ("::1", "0.0.0.0", "127.0.0.1", "localhost"))


@pytest.mark.parametrize("frontends", [1, 3])
def test_the_ipv6_wildcard_takes_ipv4_clients_too(
        monkeypatch: pytest.MonkeyPatch, frontends: int) -> None:
    """``--host ::`` binds every front end's socket for IPv6 and IPv4 alike (IPV6_V6ONLY off),
    as uvicorn and the gRPC port on the same host bind it; ``socket.create_server`` alone
    bound it for IPv6, and IPv4 clients were refused. Bound on ::1 in its stead here (tests
    listen on loopback alone): the option is what the wildcard would have."""
    real = socket.socket
    bound: list[tuple[str, bool]] = []  # each address asked for, IPV6_V6ONLY as it was bound

    class OnLoopback(real):  # type: ignore[misc, valid-type]
        """Bound on ::1 when asked for ::, and saying it is on :: with the option it was bound
        with (binding ::1 turns IPV6_V6ONLY on)."""
        wildcard: tuple[str, bool] | None = None

        def bind(self, address: tuple[Any, ...]) -> None:
            bound.append((address[0], v6_only(self)))
            if address[0] == "::":
                self.wildcard = bound[-1]
            super().bind(("::1" if self.wildcard else address[0], *address[1:]))

        def getsockname(self) -> Any:
            name = super().getsockname()
            return ("::", *name[1:]) if self.wildcard else name

        def getsockopt(self, level: int, option: int, *rest: Any) -> Any:
            if self.wildcard and (level, option) == (socket.IPPROTO_IPV6, socket.IPV6_V6ONLY):
                return int(self.wildcard[1])
            return super().getsockopt(level, option, *rest)

    monkeypatch.setattr(socket, "socket", OnLoopback)
    sock = listening_socket("::", 0, None, group=frontends > 1)
    with closing_all(for_frontends(sock, frontends)) as socks:
        assert len(set(socks)) == frontends
        assert bound == [("::", not socket.has_dualstack_ipv6())] * frontends
    bound.clear()
    listening_socket("::1", 0, None, group=False).close()  # an address: as it was
    assert bound == [("::1", True)]


def test_a_port_another_group_listens_on_is_refused_not_joined() -> None:
    """Another program (or another batchserve) listening with SO_REUSEPORT on the port: the
    server says so in one line rather than taking a share of its connections."""
    other = socket.create_server(("127.0.0.1", 0), reuse_port=True)
    with other, pytest.raises(ConfigError, match="cannot listen on 127.0.0.1:.*in use"):
        listening_socket("127.0.0.1", other.getsockname()[1], None, group=True)


def test_a_host_that_does_not_resolve_is_refused_in_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo's errors have negative numbers, which ``os.strerror`` calls "Unknown error";
    what ``socket.create_server`` raises for such a name (no lookup made here) reads as such."""
    def unresolved(address: tuple[str, int], **_: object) -> socket.socket:
        raise OSError(socket.EAI_NONAME, "Name or service not known (while attempting to bind "
                      f"on address {address!r})")

    monkeypatch.setattr(socket, "create_server", unresolved)
    with pytest.raises(ConfigError) as refused:
        listening_socket("no-such-host", 8000, None, group=False)
    assert str(refused.value) == "cannot listen on no-such-host:8000: Name or service not known"


def test_an_fd_that_is_not_a_listening_socket_is_one_line() -> None:
    with socket.socket() as unbound:
        fd = unbound.fileno()
        with pytest.raises(ConfigError, match=f"fd {fd} is a socket that is not listening"):
            listening_socket("127.0.0.1", 0, fd, group=True)
        assert unbound.fileno() == fd  # left open as it was
