"""A real S3-compatible server (moto) on loopback, for the tests of s3:// paths on both trainers.

One server per test process, emptied through moto's reset API at each use: ai2-olmo and OLMo-core cache their
S3 client per process with the endpoint it was made with (`functools.cache`), so a second server on another port
would be unreachable to every in-process test after the first (a CI failure of 32bd255: connection refused)."""

from __future__ import annotations

import atexit
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_port: int | None = None


def _start() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(lambda: (server.terminate(), server.wait()))
    # Ready when it answers HTTP, not when its port accepts: on a loaded machine the port opened while the
    # server still reset the first request (a CI failure: ConnectionResetError on the first reset call).
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, "moto_server exited at its start (port taken?)"
        try:
            _reset(port)
            return port
        except OSError:  # refused, reset, or timed out (URLError is an OSError)
            assert time.monotonic() < deadline, "moto_server did not answer within 60 s"
            time.sleep(0.2)


def _reset(port: int) -> None:
    """Empty the server (moto's reset API)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST")
    urllib.request.urlopen(request, timeout=30).close()


@contextmanager
def loopback_s3() -> Iterator[dict[str, str]]:
    """This process's `moto_server`, emptied; yields the environment that points boto3 (ai2-olmo's and
    OLMo-core's S3 clients alike) at it, with dummy credentials."""
    global _port
    if _port is None:
        _port = _start()
    else:
        _reset(_port)
    endpoint = f"http://127.0.0.1:{_port}"
    yield {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "OLMO_NO_SSL": "1",
    }
