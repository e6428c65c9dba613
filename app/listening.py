"""The HTTP listening sockets: the server's, bound here or inherited, and one for each front
end (docs/frontends.md, "Listening sockets").

Front ends that accept from one shared socket take connections unevenly: whichever wakes first
accepts all that are waiting, so a burst of new connections (a load balancer's pool, a load
generator) may land mostly on one front end and none on another, which then idles while the
others queue. So each front end gets its own socket, bound to the one address in a
``SO_REUSEPORT`` group: the kernel spreads new connections over the group by their addresses.
The device process holds every socket for the server's life, so a replaced front end takes
over its predecessor's, with the connections waiting in it.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from app.errors import ConfigError, os_reason

log = logging.getLogger("batchserve")

BACKLOG = 2048  # connections each socket queues before a front end accepts them


def listening_socket(host: str, port: int, fd: int | None, group: bool) -> socket.socket:
    """The listening socket: inherited (``fd``) or bound here, not by uvicorn, so that a port in
    use is one line and exit 2. An inherited socket is wrapped with its real family (uvicorn's
    own --fd assumes AF_UNIX, which leaves TCP_NODELAY off and costs ~40 ms per small response
    to delayed ACKs). ConfigError for an fd that is not a listening socket. With ``group``
    (several front ends) one bound here opens a ``SO_REUSEPORT`` group for ``for_frontends``."""
    if fd is None:
        return _listen(host, port, group)
    try:
        sock = socket.socket(fileno=fd)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError as exc:
        raise ConfigError(f"fd {fd}: {os_reason(exc)}; pass a listening socket's descriptor"
                          ) from None
    if not listening:
        sock.detach()  # the caller's descriptor, left open as it was
        raise ConfigError(f"fd {fd} is a socket that is not listening")
    return sock


def for_frontends(sock: socket.socket, count: int) -> list[socket.socket]:
    """A listening socket for each of ``count`` front ends: ``sock`` and ``count - 1`` more
    bound beside it where it is a TCP socket in a ``SO_REUSEPORT`` group (one bound by
    ``listening_socket`` is; one passed with --fd is if it was bound with the option). Else,
    or where one cannot be bound, ``sock`` for all of them, with an info line saying so."""
    if count <= 1:
        return [sock] * count
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or \
            not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
        log.info("the front ends share one listening socket (an inherited socket without "
                 "SO_REUSEPORT): each connection goes to the one that accepts it first")
        return [sock] * count
    siblings: list[socket.socket] = []
    dual = sock.family == socket.AF_INET6 and not sock.getsockopt(socket.IPPROTO_IPV6,
                                                                  socket.IPV6_V6ONLY)
    try:
        for _ in range(count - 1):
            siblings.append(socket.create_server(sock.getsockname(), family=sock.family,
                                                 backlog=BACKLOG, reuse_port=True,
                                                 dualstack_ipv6=dual))
    except OSError as exc:
        for sibling in siblings:
            sibling.close()
        log.info("the front ends share one listening socket (another could not be bound "
                 "beside it: %s)", os_reason(exc))
        return [sock] * count
    return [sock, *siblings]


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def dual_stack(host: str) -> bool:
    """Whether ``host`` is the IPv6 wildcard (``::``) on a system that can take IPv4 on it: it
    is then bound to take both, as uvicorn and gRPC core (the gRPC port) bind it, where
    ``socket.create_server`` binds it for IPv6 alone and refused IPv4 clients (a dual-stack
    cluster's probes) that the gRPC port on the same host took."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name
        return False
    return address.version == 6 and address.is_unspecified and socket.has_dualstack_ipv6()


def _listen(host: str, port: int, group: bool) -> socket.socket:
    """Bound here for every front end; ConfigError if it cannot be. A group's first socket is
    bound without ``SO_REUSEPORT`` first, so that a port another program (or another
    batchserve) listens on is refused rather than shared."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    dual = dual_stack(host)
    try:
        if group and port:
            socket.create_server((host, port), family=family, dualstack_ipv6=dual).close()
        return socket.create_server((host, port), family=family, backlog=BACKLOG,
                                    reuse_port=group, dualstack_ipv6=dual)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {os_reason(exc)}") from None
