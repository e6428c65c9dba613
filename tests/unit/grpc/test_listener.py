"""The gRPC port held for the server's life (``reserved``)."""

from __future__ import annotations

import socket

import pytest

from app.errors import ConfigError
from app.grpc.listener import reserved


def _left_in_time_wait() -> int:
    """A port whose server closed its connection first, then stopped listening: the closed
    connection holds the port in TIME_WAIT (FIN_WAIT_2 till the client's close) for a minute,
    as a restarted server's gRPC port is held after it served clients."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
    accepted.close()
    assert client.recv(1) == b""  # the server's FIN came
    client.close()
    return port


def test_a_port_its_last_server_left_in_time_wait_is_taken_again() -> None:
    port = _left_in_time_wait()
    with reserved("127.0.0.1", port) as sock:
        assert sock is not None and sock.getsockname()[1] == port


@pytest.mark.parametrize("reuse_port", [False, True])
def test_a_port_another_program_listens_on_is_refused(reuse_port: bool) -> None:
    with socket.create_server(("127.0.0.1", 0), reuse_port=reuse_port) as other:
        port = other.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port} for gRPC: "
                                              ".*in use"), reserved("127.0.0.1", port):
            pass


def test_no_port_reserves_nothing() -> None:
    with reserved("127.0.0.1", 0) as sock:
        assert sock is None
