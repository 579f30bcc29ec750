"""A loopback HTTP file server for the fetch tests: HEAD, GET with Range and If-Range, ETag (the MD5, as S3
gives), and faults on demand: 404 for a path, a connection dropped after N bytes, a slow body."""

from __future__ import annotations

import hashlib
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Served:
    files: dict[str, bytes] = field(default_factory=dict)
    """path (no leading slash) -> content"""
    missing: set[str] = field(default_factory=set)
    """paths answered with 404"""
    drop_after: dict[str, int] = field(default_factory=dict)
    """path -> drop the connection after this many body bytes, once per GET, while the count lasts"""
    drops: dict[str, int] = field(default_factory=dict)
    """path -> how many GETs still drop (default 1 when drop_after is set)"""
    hold: dict[str, int] = field(default_factory=dict)
    """path -> after this many body bytes, wait for `release` before sending the rest: a transfer caught
    mid-file however slow the machine is"""
    release: threading.Event = field(default_factory=threading.Event)
    before_get: Callable[[str], None] | None = None
    log: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Range header) of every request"""

    def etag(self, path: str) -> str:
        return f'"{hashlib.md5(self.files[path]).hexdigest()}"'

    def get_requests(self) -> list[str]:
        return [p for m, p, _ in self.log if m == "GET"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served: Served

    def log_message(self, *args) -> None:  # quiet
        pass

    def _path(self) -> str:
        return self.path.lstrip("/")

    def _not_found(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        s, path = self.served, self._path()
        s.log.append((self.command, path, self.headers.get("Range")))
        if path in s.missing or path not in s.files:
            return self._not_found()
        if body and s.before_get is not None:
            s.before_get(path)
        data, etag = s.files[path], s.etag(path)
        start, end, status = 0, len(data), 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match and self.headers.get("If-Range", etag) == etag:
            start = int(match[1])
            end = min(int(match[2]) + 1, end) if match[2] else end
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        payload = data[start:end]
        limit = len(payload)
        if path in s.drop_after and s.drops.get(path, 1) > 0:
            s.drops[path] = s.drops.get(path, 1) - 1
            limit = min(limit, s.drop_after[path])
        for i in range(0, limit, 16384):
            if i >= s.hold.get(path, limit):
                s.release.wait(timeout=600)
            self.wfile.write(payload[i : min(i + 16384, limit)])
        if limit < len(payload):  # the fault: a connection that ends mid-file
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True


class FileServer:
    """`with FileServer(served) as server: server.url("a/b.npy")`"""

    def __init__(self, served: Served) -> None:
        handler = type("Handler", (_Handler,), {"served": served})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.served = served
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return f"{self.base}/{path}"

    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
