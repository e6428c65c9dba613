"""One front-end process: ``python -m app.frontend.entry`` (started by app/supervisor.py).

Its settings come pickled on standard input; the listening socket and its link to the device
process are inherited file descriptors. It serves until SIGTERM (then drains what it holds), or
until the device process goes away (then it answers 503 and exits 1).
"""

from __future__ import annotations

import argparse
import pickle
import socket
import sys

from app.config import Settings


def main() -> int:
    parser = argparse.ArgumentParser(prog="batchserve-frontend")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--device-socket", required=True)
    args = parser.parse_args()
    settings = pickle.load(sys.stdin.buffer)
    assert isinstance(settings, Settings)
    from app.server import run_frontend

    return run_frontend(settings, socket.socket(fileno=args.listen_fd),
                        socket.socket(fileno=args.link_fd), args.device_socket)


if __name__ == "__main__":
    sys.exit(main())
