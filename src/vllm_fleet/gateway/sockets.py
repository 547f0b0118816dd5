"""The gateway's listening socket, bound before the server (or its processes) start."""

from __future__ import annotations

import socket

from vllm_fleet.errors import ConfigError


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """`reuse_port`: one of several gateway processes on this port (multiprocess.py)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock
