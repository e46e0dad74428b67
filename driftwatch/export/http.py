"""The metrics listener: ``/metrics`` plus a small landing page, on a WSGI server.

One thread accepts connections and answers at once a plain-HTTP request that has fully
arrived (a scrape wakes one thread); a few long-lived handler threads answer the others (as
waitress does: no thread is started per scrape). Every connection has a timeout, so clients
that connect and never speak hold a handler for ``CONNECTION_TIMEOUT_SECONDS`` at most. With TLS
(as ``prometheus_client.start_http_server`` offers it: a certificate and key, and optionally a
client CA that every scraper's certificate must chain to), the handshake runs in the handler,
under the same timeout.
"""

from __future__ import annotations

import errno
import html
import ipaddress
import logging
import queue
import selectors
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from driftwatch import __version__
from driftwatch.errors import ListenError, UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 19461
"""The port of ``/metrics`` unless told: on no exporter's list, outside the ephemeral range."""

HANDLER_THREADS = 4
"""Connections answered at once; more wait their turn (a scrape takes milliseconds)."""
CONNECTION_TIMEOUT_SECONDS = 10.0
"""Seconds a connection may stay silent (its TLS handshake included) before it is dropped."""

ANSWER_AT_ONCE_TIMEOUT_SECONDS = 1.0
"""Seconds the accepting thread may wait to send an answer (tens of kB, which the socket's
buffers take at once unless the client stops reading)."""
REQUEST_HEAD_BYTES = 8192
"""Bytes of a new connection looked at, unread, for the end of its request's head."""

log = logging.getLogger(__name__)


def _head_arrived(request: socket.socket) -> bool:
    """Whether the request's head (up to its blank line) is all here already: reading it
    cannot wait on the client."""
    try:
        head = request.recv(REQUEST_HEAD_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing yet (EAGAIN), or the client is gone
        return False
    return b"\r\n\r\n" in head or b"\n\n" in head


WsgiApp = Callable[..., Iterable[bytes]]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (loopback) into a host and a port."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"--listen {text!r}: port must be a number from 0 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as err:
            raise UsageError(f"--listen {text!r}: {host!r} is not an IPv6 address") from err
    elif ":" in host:
        raise UsageError(f"--listen {text!r}: write IPv6 addresses in brackets, e.g. [::1]:PORT")
    return host or DEFAULT_HOST, int(port_text)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Serve HTTPS with ``cert`` and ``key``; with ``client_ca`` (a PEM file or a directory of
    hashed certificates), only scrapers presenting a certificate it signed get an answer."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        """The server's TLS context (TLS 1.2 or newer); ``UsageError`` naming a bad file."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(certfile=self.cert, keyfile=self.key)
        except OSError as err:
            raise UsageError(
                f"--tls-cert {self.cert} / --tls-key {self.key}: cannot load the certificate "
                f"and its key: {_reason(err)}"
            ) from err
        if self.client_ca is not None:
            directory = self.client_ca.is_dir()
            try:
                context.load_verify_locations(
                    capath=self.client_ca if directory else None,
                    cafile=None if directory else self.client_ca,
                )
            except OSError as err:
                raise UsageError(
                    f"--tls-client-ca {self.client_ca}: cannot load CA certificates: {_reason(err)}"
                ) from err
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _reason(err: OSError) -> str:
    if isinstance(err, ssl.SSLError):
        return err.reason or str(err)
    return err.strerror or str(err)


class _Server(WSGIServer):
    allow_reuse_address = True
    tls: ssl.SSLContext | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._connections: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._handlers: list[threading.Thread] = []
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Answer a plain-HTTP request whose head has already arrived at once, in this
        thread (a scrape then wakes one thread, not two); queue any other connection for the
        handler threads (started with the first)."""
        if self.tls is None and _head_arrived(request):
            request.settimeout(ANSWER_AT_ONCE_TIMEOUT_SECONDS)
            self._answer(request, client_address)
            return
        request.settimeout(CONNECTION_TIMEOUT_SECONDS)
        if not self._handlers:
            self._handlers = [
                threading.Thread(target=self._handle, name="driftwatch-http", daemon=True)
                for _ in range(HANDLER_THREADS)
            ]
            for handler in self._handlers:
                handler.start()
        self._connections.put((request, client_address))

    def _handle(self) -> None:
        """One handler thread: answer queued connections until ``server_close``."""
        while (connection := self._connections.get()) is not None:
            self._answer(*connection)

    def _answer(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - one connection must not end its thread
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went silent or away is no error of ours: debug, not a traceback."""
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("connection from %s ended early", client_address, exc_info=True)
        else:
            log.exception("answering %s failed", client_address)

    def server_close(self) -> None:
        super().server_close()
        for _ in self._handlers:
            self._connections.put(None)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The TLS handshake first, when serving HTTPS (in a handler thread)."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        try:
            secure = self.tls.wrap_socket(request, server_side=True)
        except OSError:  # not TLS, or no or a wrong client certificate
            return
        with secure:
            super().finish_request(secure, client_address)


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the terminal; stay quiet."""


def _landing_page(metrics_app: WsgiApp, title: str) -> WsgiApp:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'><title>driftwatch</title></head>"
        f"<body><h1>driftwatch {html.escape(__version__)}</h1><p>{html.escape(title)}</p>"
        "<p><a href='/metrics'>Metrics</a></p></body></html>"
    ).encode()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [body]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: see /metrics\n"]

    return app


class MetricsServer:
    """Serves in a daemon thread; ``port`` is the bound port (useful with port 0).

    With ``tls`` (see ``TlsConfig.context``), it serves HTTPS.
    """

    def __init__(
        self,
        metrics_app: WsgiApp,
        host: str,
        port: int,
        title: str = "",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        server_class = _V6Server if ":" in host else _Server
        try:
            self._server = make_server(
                host, port, _landing_page(metrics_app, title), server_class, _QuietHandler
            )
        except socket.gaierror as err:
            raise ListenError(f"cannot listen on {host}:{port}: unknown host {host!r}") from err
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ListenError(
                    f"cannot listen on {host}:{port}: the port is already in use; "
                    "pick another with --listen HOST:PORT (port 0 picks a free one)"
                ) from err
            if err.errno == errno.EADDRNOTAVAIL:
                raise ListenError(
                    f"cannot listen on {host}:{port}: no such address on this machine"
                ) from err
            if err.errno == errno.EACCES:
                raise ListenError(
                    f"cannot listen on {host}:{port}: permission denied (ports below 1024 "
                    "need root)"
                ) from err
            raise ListenError(f"cannot listen on {host}:{port}: {err.strerror}") from err
        self._server.tls = tls
        self.host = host
        self.port: int = self._server.server_port
        self._wake, self._woken = socket.socketpair()  # close() wakes the loop through it
        self._thread = threading.Thread(target=self._serve, name="driftwatch-metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """Handle each connection as it comes, until ``close``: no wake-up in between (the
        library's ``serve_forever`` polls twice a second for its shutdown flag, 0.04 s of CPU
        in 300 s, a few percent of a daemon's)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._woken, selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fileobj is self._woken for key, _ in ready):
                    return
                self._server.handle_request()  # a connection is waiting: no wait here

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "http" if self._server.tls is None else "https"
        return f"{scheme}://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._wake.send(b"\0")
        self._thread.join()
        self._server.server_close()
        self._wake.close()
        self._woken.close()
