"""One front-end process: ``python -m app.frontend.entry`` (started by app/supervisor.py).

Its settings come pickled on standard input; the listening socket and its link to the device
process are inherited file descriptors. It serves until SIGTERM, or its device process's
``DRAIN`` (app/draining.py), then drains what it holds; or until the device process goes away
(then it answers 503 and exits 1). It never imports torch:
it decodes with handlers the device process sends (app/snapshot.py) and computes nothing.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys

from app.config import Settings, drain_limit_s
from app.draining import DrainingServer, server_config
from app.frontend.app import create_frontend_app
from app.frontend.remote import RemoteService
from app.grpc.listener import GrpcListener
from app.logs import configure_logging
from app.process import tune_for_serving


def main() -> int:
    parser = argparse.ArgumentParser(prog="batchserve-frontend")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    args = parser.parse_args()
    settings = pickle.load(sys.stdin.buffer)
    assert isinstance(settings, Settings)
    return run(settings, socket.socket(fileno=args.listen_fd),
               socket.socket(fileno=args.link_fd))


def run(settings: Settings, listener: socket.socket, link: socket.socket) -> int:
    """One front end until it is stopped or its device process is gone; the exit code."""
    configure_logging(settings.log_level, settings.log_format)
    tune_for_serving()
    service = RemoteService(settings)
    app = create_frontend_app(service, link)
    grpc = GrpcListener(settings, service, service.link.ask, service.link.sync) \
        if settings.grpc_port else None
    server = DrainingServer(server_config(settings, app), service, drain_limit_s(settings), grpc,
                            role=f"front end {os.getpid()}", asked=True)
    server.run(sockets=[listener])
    return 0 if server.started and not server.fatal else 1


if __name__ == "__main__":
    sys.exit(main())
