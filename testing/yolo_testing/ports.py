"""Ports for the services tests and benchmarks start."""

import socket


def free_port():
    """A TCP port on 127.0.0.1 that no one listens on now (another may take it before the
    caller does: the caller's service then fails to start, and says so)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]
