"""The web view's HTTP server: pages, JSON endpoints and a Server-Sent Events stream.

Stdlib only (``http.server``): a handful of GET routes over `runwatch.ui.model`, run on
threads; no framework would make these routes shorter or the view safer. Pages are static
shells (package data in ``runwatch/ui/static``) that fetch JSON; charts arrive as SVG
drawn here (`runwatch.ui.charts`); ``/api/events`` tells open pages when to fetch again.

Bounded and quiet edges (issue 19, finding 11):

* Host check (against DNS rebinding): a request whose ``Host`` header names anything but
  the bound address, ``localhost``, ``127.0.0.1``, ``::1`` or a ``--allow-host`` name is
  refused (403) before any route runs.
* POST: a ``Content-Length`` that is not a number or is negative is a 400 at once; one
  above `MAX_BODY_BYTES` is a 413, its body never read; the connection closes.
* POST needs the server's CSRF token in the ``X-Runwatch-CSRF`` header (the pages carry
  it in a ``<meta name="runwatch-csrf">``; a form of another site can set no header), and
  an ``Origin`` header, when sent, must be this server's own.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import secrets
import threading
from collections.abc import Collection
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from runwatch.common.errors import RunwatchError
from runwatch.schemas.events import AnomalyDetected, RestartRequested, event_name
from runwatch.schemas.kinds import Chart, kinds_where
from runwatch.ui.calibration import calibration_json
from runwatch.ui.charts import Band, Marker, Point, VLine, line_chart
from runwatch.ui.model import FleetQuery, WebviewData

log = logging.getLogger(__name__)

STATIC: Final[dict[str, str]] = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "fleet.html": "text/html; charset=utf-8",
    "run.html": "text/html; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
EVENT_KEEPALIVE_S: Final = 15.0
EVENT_MIN_INTERVAL_S: Final = 0.5
"""Open pages are told about changes at most this often (a busy fleet changes constantly)."""

MAX_BODY_BYTES: Final = 16 * 1024
"""The largest POST body read (the audit POST has none)."""
LOCAL_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})
CSRF_HEADER: Final = "X-Runwatch-CSRF"
PAGES: Final = frozenset({"fleet.html", "run.html"})
"""The pages that get the CSRF token."""

LOSS_KINDS: Final = kinds_where(chart=Chart.LOSS)
GRAD_KINDS: Final = kinds_where(chart=Chart.GRAD_NORM)


def _static(name: str) -> bytes:
    return resources.files("runwatch.ui").joinpath("static", name).read_bytes()


def host_name(header: str) -> str:
    """The host of a ``Host`` header (or an Origin's authority), lower case, no port.

    ``[::1]:8470`` -> ``::1``; ``Example.org:80`` -> ``example.org``.
    """
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _float(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(value)
    return None


def run_charts(page: dict[str, Any]) -> dict[str, str]:
    """The loss, grad-norm and MFU charts of a run page (SVG strings)."""
    points = page["points"]
    feed = page["feed"]
    anomalies = [e for e in feed if e["type"] == event_name(AnomalyDetected)]
    actions = {
        e["incarnation"]: e["action"] for e in feed if e["type"] == event_name(RestartRequested)
    }
    vlines = [
        VLine(
            step=r["at_step"],
            kind=actions.get(r["incarnation"] - 1, "restart"),
            label=(
                f"incarnation {r['incarnation']} resumed from step {r['from_step']} "
                f"({actions.get(r['incarnation'] - 1, 'restart')}); continuity {r['continuity']}"
            ),
            broken=r["continuity"] == "broken",
        )
        for r in page["restarts"]
    ]

    def markers(own: frozenset[str]) -> list[Marker]:
        out = []
        for a in anomalies:
            value = _float(a.get("value")) if a["kind"] in own else None
            rank = "" if a.get("rank") is None else f" rank {a['rank']}"
            out.append(
                Marker(
                    step=a["step"],
                    value=value if value is not None and math.isfinite(value) else None,
                    kind=a["kind"],
                    label=f"{a['kind']} at step {a['step']}{rank}: {a.get('detail', '')}",
                )
            )
        return out

    bands = [
        Band(
            d["first"],
            d["last"],
            f"steps {d['first']}-{d['last']}: {d['groups']} of {d['of']} replica groups stepping",
        )
        for d in page.get("degraded", ())
    ]

    def series(col: int) -> list[Point]:
        return [Point(p[0], _float(p[col]), p[1]) for p in points if p[col] is not None]

    return {
        "loss": line_chart(
            "loss",
            series(2),
            markers=markers(LOSS_KINDS),
            vlines=vlines,
            bands=bands,
            chart_id="chart-loss",
        ),
        "grad_norm": line_chart(
            "grad norm",
            series(3),
            markers=markers(GRAD_KINDS),
            vlines=vlines,
            chart_id="chart-grad",
        ),
        "mfu": line_chart(
            "MFU",
            series(4),
            markers=markers(frozenset()),
            vlines=vlines,
            bands=bands,
            percent=True,
            chart_id="chart-mfu",
        ),
    }


class UiServer:
    """Serves the web view of one `WebviewData` store on a thread."""

    def __init__(
        self,
        data: WebviewData,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        allow_hosts: Collection[str] = (),
    ) -> None:
        """Bind the socket (port 0: any free port).

        Args:
            data: The store the pages show.
            host: The address to listen on.
            port: The port.
            allow_hosts: Host names a request's ``Host`` header may carry besides the
                bound address and the loopback names (the name the view is reached by).

        Raises:
            RunwatchError: The address cannot be bound (in use, not local, no permission).
        """
        self.data = data
        self.allowed_hosts = frozenset(
            {*LOCAL_HOSTS, host_name(host), *(host_name(h) for h in allow_hosts)}
        )
        self.csrf_token = secrets.token_urlsafe(32)
        handler = type("Handler", (_Handler,), {"ui": self})
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise RunwatchError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        self._serving = False
        self._audits: set[str] = set()
        self._audit_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The address of the fleet page."""
        host, port = self.httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown}:{port}/"

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._serving = True
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="webview-http", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        """Serve on this thread until KeyboardInterrupt."""
        self._serving = True
        try:
            self.httpd.serve_forever()
        finally:
            self._serving = False

    def close(self) -> None:
        """Stop serving (if it was) and release the socket."""
        if self._serving:  # shutdown() waits for a serve_forever loop that must be running
            self._serving = False
            self.httpd.shutdown()
        self.httpd.server_close()

    def start_audit(self, run_id: str) -> bool:
        """Audit ``run_id`` in the background; False when one is already running."""
        with self._audit_lock:
            if run_id in self._audits:
                return False
            self._audits.add(run_id)

        def work() -> None:
            try:
                self.data.audit_run(run_id)
            finally:
                with self._audit_lock:
                    self._audits.discard(run_id)

        threading.Thread(target=work, name=f"audit-{run_id}", daemon=True).start()
        return True

    def auditing(self, run_id: str) -> bool:
        """True while an audit of ``run_id`` started here is running."""
        with self._audit_lock:
            return run_id in self._audits


class _Handler(BaseHTTPRequestHandler):
    ui: UiServer
    server_version = "runwatch-ui"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # ------------------------------------------------------------ responses

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any, status: int = HTTPStatus.OK) -> None:
        body = json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
        self._send(status, body, "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json({"error": message}, status)

    # ------------------------------------------------------------ routes

    def _page(self, name: str) -> None:
        """A page shell, carrying this server's CSRF token."""
        meta = f'<meta name="runwatch-csrf" content="{self.ui.csrf_token}">\n</head>'
        body = _static(name).replace(b"</head>", meta.encode(), 1)
        self._send(HTTPStatus.OK, body, STATIC[name])

    def _host_ok(self) -> bool:
        """Refuse (403) a request for another host name (DNS rebinding); True if allowed."""
        if host_name(self.headers.get("Host", "")) in self.ui.allowed_hosts:
            return True
        self.close_connection = True
        self._error(HTTPStatus.FORBIDDEN, "Host not allowed (start runwatch ui with --allow-host)")
        return False

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if not self._host_ok():
            return
        url = urlsplit(self.path)
        path = url.path
        try:
            if path in ("/", "/index.html"):
                self._page("fleet.html")
            elif path.startswith("/run/"):
                self._page("run.html")
            elif path.startswith("/static/") and path[len("/static/") :] in STATIC:
                name = path[len("/static/") :]
                self._send(HTTPStatus.OK, _static(name), STATIC[name])
            elif path == "/api/fleet":
                self._fleet(parse_qs(url.query))
            elif path.startswith("/api/runs/"):
                self._run(unquote(path[len("/api/runs/") :]))
            elif path == "/api/events":
                self._events()
            elif path == "/api/calibration":  # computed on demand, bounded: ui/calibration.py
                self._json(*calibration_json(self.ui.data, parse_qs(url.query)))
            elif path == "/healthz":
                self._json({"ok": not self.ui.data.error, "error": self.ui.data.error})
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such page: {path}")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser went away

    def _post_refusal(self) -> tuple[int, str] | None:
        """Why this POST is refused before its body is read (status, message); None: not.

        Rules, in order: 1. a Content-Length that is no number or negative -> 400;
        2. one above `MAX_BODY_BYTES` -> 413; 3. an Origin other than this server -> 403;
        4. no or a wrong CSRF token -> 403.
        """
        raw = self.headers.get("Content-Length") or "0"
        if not raw.isdigit():
            return HTTPStatus.BAD_REQUEST, "Content-Length must be a non-negative integer"
        if int(raw) > MAX_BODY_BYTES:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes"
        origin = self.headers.get("Origin")
        if origin is not None and (
            urlsplit(origin).scheme not in ("http", "https")
            or urlsplit(origin).netloc.lower() != self.headers.get("Host", "").strip().lower()
        ):
            return HTTPStatus.FORBIDDEN, "cross-origin POST refused"
        token = self.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(token.encode(), self.ui.csrf_token.encode()):
            return HTTPStatus.FORBIDDEN, f"missing or wrong {CSRF_HEADER} token"
        return None

    def do_POST(self) -> None:
        if not self._host_ok():
            return
        refusal = self._post_refusal()
        if refusal is not None:
            self.close_connection = True  # the body, if any, is never read
            self._error(*refusal)
            return
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if path.startswith("/api/runs/") and path.endswith("/audit"):
            run_id = unquote(path[len("/api/runs/") : -len("/audit")])
            if run_id not in self.ui.data.run_ids():
                self._error(HTTPStatus.NOT_FOUND, f"no run {run_id!r}")
                return
            started = self.ui.start_audit(run_id)
            self._json({"run_id": run_id, "started": started}, HTTPStatus.ACCEPTED)
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")

    def _fleet(self, params: dict[str, list[str]]) -> None:
        def one(name: str, default: str = "") -> str:
            return params.get(name, [default])[0]

        try:
            query = FleetQuery(
                text=one("q"),
                status=one("status"),
                sort=one("sort", "run"),
                descending=one("desc") in ("1", "true"),
                page=int(one("page", "0")),
                page_size=int(one("size", "50")),
            )
            page = self.ui.data.fleet(query)
        except ValueError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        self._json(page)

    def _run(self, run_id: str) -> None:
        page = self.ui.data.run(run_id)
        if page is None:
            self._error(HTTPStatus.NOT_FOUND, f"no run {run_id!r} known to the processors yet")
            return
        page["charts"] = run_charts(page)
        page["auditing"] = self.ui.auditing(run_id)
        self._json(page)

    def _events(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        data = self.ui.data
        seen = -1
        stop = threading.Event()
        while not stop.is_set():
            version = data.wait_for_change(seen, EVENT_KEEPALIVE_S)
            if version == seen:
                self.wfile.write(b": keepalive\n\n")
            else:
                seen = version
                msg = json.dumps({"version": version, "error": data.error})
                self.wfile.write(f"event: change\ndata: {msg}\n\n".encode())
            self.wfile.flush()
            stop.wait(EVENT_MIN_INTERVAL_S)  # rate limit: at most two refreshes a second


__all__ = ["MAX_BODY_BYTES", "UiServer", "host_name", "run_charts"]
