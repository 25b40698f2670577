"""A WebSocket client on a raw socket, for clients that stop reading.

Browsers and client libraries keep reading; a slow or stuck client does not.
:func:`open_socket` does the handshake with a tiny receive buffer and leaves
the reading to the caller; :func:`read_frame` reads one server frame;
:func:`close_code` drains what the server sent and returns its close code.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import time


def open_socket(port: int, origin: str, sessionid: str, *, rcvbuf: int = 4096) -> socket.socket:
    """A handshaken WebSocket to ``/ws/approvals/`` on ``port``, receive buffer ``rcvbuf``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/approvals/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: {origin}\r\nCookie: sessionid={sessionid}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(head.decode("latin-1"))
    return sock


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed mid-frame")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One server frame: ``(opcode, payload)`` (server frames are not masked)."""
    first, second = _exactly(sock, 2)
    size = second & 0x7F
    if size == 126:
        size = struct.unpack("!H", _exactly(sock, 2))[0]
    elif size == 127:
        size = struct.unpack("!Q", _exactly(sock, 8))[0]
    return first & 0x0F, _exactly(sock, size)


#: What :func:`close_code` returns when the server ended the connection without a
#: close frame the client could read (it aborts a peer that does not answer its close).
DROPPED = 0


def close_code(sock: socket.socket, timeout: float = 30) -> int | None:
    """Read frames until the server's close frame and return its code; :data:`DROPPED`
    when the connection ended without one; ``None`` when it is still open at ``timeout``."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            opcode, payload = read_frame(sock)
            if opcode == 0x8:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else DROPPED
    except TimeoutError:
        return None
    except (OSError, ConnectionError):
        return DROPPED
    return None
