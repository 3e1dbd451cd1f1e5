"""A loopback TCP port relayed byte for byte to the daemon's unix socket.

The conformance client cannot send a bearer token, and the unix socket is
the transport that needs none (its file mode is the guard), so the suite
reaches ``/mcp`` through this relay. Nothing is rewritten: ``Host`` and
``Origin`` arrive as the client sent them.
"""

from __future__ import annotations

import socket
import threading


class Relay:
    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            try:
                upstream.connect(self.unix_path)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.server.close()
