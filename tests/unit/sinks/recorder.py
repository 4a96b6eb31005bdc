"""A real HTTP server on 127.0.0.1 that records the JSON POSTs it receives."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Recorder:
    """Records requests; answers 500 to the first ``fail_first`` of them.

    Use as a context manager; ``url`` is the address to POST to.
    """

    def __init__(self, fail_first: int = 0, status_when_failing: int = 500, port: int = 0) -> None:
        self.fail_first = fail_first
        self.status_when_failing = status_when_failing
        self.attempts = 0
        self.bodies: list[Any] = []
        self.cond = threading.Condition()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with recorder.cond:
                    recorder.attempts += 1
                    failing = recorder.attempts <= recorder.fail_first
                    if not failing:
                        recorder.bodies.append(json.loads(body))
                    recorder.cond.notify_all()
                self.send_response(recorder.status_when_failing if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def free_port() -> int:
        """A port nothing listens on now (a receiver that is down)."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, done: Any, timeout_s: float = 30.0) -> list[Any]:
        """Wait until ``done(bodies)``; returns the bodies (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not done(self.bodies):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; received {self.bodies}")
                self.cond.wait(left)
            return list(self.bodies)
