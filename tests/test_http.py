from __future__ import annotations

import logging
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from driftwatch import Hook
from driftwatch.errors import ListenError, UsageError
from driftwatch.export import http
from driftwatch.export.http import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MetricsServer,
    TlsConfig,
    parse_listen,
)
from driftwatch.export.prometheus import metrics_app
from tests.conftest import run_cli, wait_for
from tests.test_cli import assert_one_line_error


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    running = MetricsServer(metrics_app(list), "127.0.0.1", 0, "watching nothing")
    yield running
    running.close()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_metrics_landing_page_and_not_found(server: MetricsServer) -> None:
    status, content_type, body = get(server.url)
    assert status == 200
    assert content_type.startswith("text/plain")
    assert "driftwatch_build_info" in body
    status, content_type, body = get(f"http://127.0.0.1:{server.port}/")
    assert (status, content_type) == (200, "text/html; charset=utf-8")
    assert "href='/metrics'" in body
    assert "watching nothing" in body
    assert get(f"http://127.0.0.1:{server.port}/nope")[0] == 404


def wake_ups(thread: threading.Thread) -> int:
    """How many times ``thread`` has slept and been woken (voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def test_an_idle_server_sleeps_until_a_scrape_and_closes_at_once() -> None:
    running = MetricsServer(metrics_app(list), "127.0.0.1", 0)
    (serving,) = [t for t in threading.enumerate() if t.name == "driftwatch-metrics"]
    get(running.url)  # the loop is running
    time.sleep(0.2)  # and back in its wait, once done with the connection it answered
    before = wake_ups(serving)
    time.sleep(1.6)  # the library's serve_forever would have woken 3 times
    assert wake_ups(serving) - before == 0
    assert get(running.url)[0] == 200
    began = time.monotonic()
    running.close()
    assert time.monotonic() - began < 0.25
    assert not serving.is_alive()


def test_port_zero_binds_a_free_port(server: MetricsServer) -> None:
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        running = MetricsServer(metrics_app(list), "::1", 0)
    except ListenError as err:
        pytest.skip(f"IPv6 loopback unavailable: {err}")
    try:
        assert running.url.startswith("http://[::1]:")
        assert get(running.url)[0] == 200
    finally:
        running.close()


def test_busy_port_is_a_listen_error(busy_port: int) -> None:
    with pytest.raises(ListenError, match="already in use"):
        MetricsServer(metrics_app(list), "127.0.0.1", busy_port)


def test_address_not_on_this_machine_is_a_listen_error() -> None:
    with pytest.raises(ListenError, match="no such address"):
        MetricsServer(metrics_app(list), "192.0.2.1", 0)  # TEST-NET-1: never local


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9000", ("127.0.0.1", 9000)),
        (":0", (DEFAULT_HOST, 0)),
        ("0.0.0.0:19461", ("0.0.0.0", 19461)),
        ("[::1]:8080", ("::1", 8080)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9000", "host:", "host:http", "h:70000", "[zz]:1", "::1:80"])
def test_parse_listen_rejects_malformed_addresses(text: str) -> None:
    with pytest.raises(UsageError, match="--listen"):
        parse_listen(text)


def test_default_listener_is_loopback_outside_the_allocated_exporter_range() -> None:
    assert DEFAULT_HOST == "127.0.0.1"
    assert not 9100 <= DEFAULT_PORT <= 9999
    assert DEFAULT_PORT < 32768  # below Linux's ephemeral range


class Pki:
    """A throwaway CA with a server certificate for 127.0.0.1 and client certificates, made
    by the openssl command; ``rogue_client`` is signed by another CA."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = self._ca("ca")
        self.server = self._signed("server", self.ca, "subjectAltName=IP:127.0.0.1")
        self.client = self._signed("client", self.ca, "extendedKeyUsage=clientAuth")
        self.rogue_client = self._signed("rogue", self._ca("rogue-ca"), "")

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.dir, check=True, capture_output=True)

    def _ca(self, name: str) -> Path:
        self._openssl(
            *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2"),
            *("-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE"),
        )
        return self.dir / f"{name}.pem"

    def _signed(self, name: str, ca: Path, extension: str) -> Path:
        """Writes ``name.pem`` and ``name.key``; returns the certificate's path."""
        (self.dir / f"{name}.ext").write_text(extension + "\n")
        self._openssl(
            *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
            *("-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}"),
        )
        self._openssl(
            *("x509", "-req", "-in", f"{name}.csr", "-CA", ca.name, "-CAkey", ca.stem + ".key"),
            *("-CAcreateserial", "-out", f"{name}.pem", "-days", "2"),
            *("-extfile", f"{name}.ext"),
        )
        return self.dir / f"{name}.pem"

    def client_context(self, cert: Path | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        if cert is not None:
            context.load_cert_chain(cert, cert.with_suffix(".key"))
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def scrape(url: str, context: ssl.SSLContext) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        assert response.status == 200
        return str(response.read().decode())


def test_https(pki: Pki) -> None:
    tls = TlsConfig(pki.server, pki.server.with_suffix(".key")).context()
    running = MetricsServer(metrics_app(list), "127.0.0.1", 0, tls=tls)
    try:
        assert running.url == f"https://127.0.0.1:{running.port}/metrics"
        assert "driftwatch_build_info" in scrape(running.url, pki.client_context())
        with pytest.raises(ConnectionResetError):  # plain HTTP gets no answer
            urllib.request.urlopen(running.url.replace("https", "http"), timeout=10)
    finally:
        running.close()


def test_mutual_tls_answers_only_clients_the_ca_signed(pki: Pki) -> None:
    tls = TlsConfig(pki.server, pki.server.with_suffix(".key"), pki.ca).context()
    running = MetricsServer(metrics_app(list), "127.0.0.1", 0, tls=tls)
    try:
        assert "driftwatch_build_info" in scrape(running.url, pki.client_context(pki.client))
        for stranger, alert in [(None, "CERTIFICATE_REQUIRED"), (pki.rogue_client, "UNKNOWN_CA")]:
            with pytest.raises((ssl.SSLError, OSError)) as refused:
                scrape(running.url, pki.client_context(stranger))
            # TLS 1.3 checks the client's certificate after the client's handshake is done:
            # when the server closes first, the client sees the closed connection, not the
            # alert. Either way it got no metrics.
            error = refused.value
            if isinstance(error, urllib.error.URLError):
                error = error.reason  # type: ignore[assignment]
            lost_alert = isinstance(error, ssl.SSLEOFError | ConnectionResetError)
            assert lost_alert or alert in str(error), repr(error)
    finally:
        running.close()


def test_a_silent_client_does_not_hold_up_https_scrapes(pki: Pki) -> None:
    tls = TlsConfig(pki.server, pki.server.with_suffix(".key")).context()
    running = MetricsServer(metrics_app(list), "127.0.0.1", 0, tls=tls)
    try:
        with socket.create_connection(("127.0.0.1", running.port)):  # connects, never speaks
            assert "driftwatch_build_info" in scrape(running.url, pki.client_context())
    finally:
        running.close()


def test_the_hooks_own_server_speaks_https_and_a_bad_certificate_only_warns(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = pki.server.with_suffix(".key")
    hook = Hook(channel_dir=str(tmp_path), listen="127.0.0.1:0", tls=TlsConfig(pki.server, key))
    try:
        server = hook._server
        assert server is not None
        assert server.url.startswith("https://127.0.0.1:")
        # The in-process monitor's first tick may come after the server is up.
        context = pki.client_context()
        wait_for(
            lambda: 'driftwatch_source_up{run="' in scrape(server.url, context),
            15,
            "the hook's own series over HTTPS",
        )
    finally:
        hook.close()
    with caplog.at_level(logging.WARNING):
        broken = Hook(channel_dir=str(tmp_path), listen="127.0.0.1:0", tls=TlsConfig(key, key))
    assert broken._server is None
    assert "not serving /metrics from this process: --tls-cert" in caplog.text
    with broken.step():  # training goes on
        pass
    broken.close()


def test_unusable_tls_files_are_usage_errors(pki: Pki, tmp_path: Path) -> None:
    key = pki.server.with_suffix(".key")
    with pytest.raises(UsageError, match=r"--tls-cert .*missing\.pem"):
        TlsConfig(tmp_path / "missing.pem", key).context()
    with pytest.raises(UsageError, match="--tls-cert"):  # a key that is not the cert's
        TlsConfig(pki.server, pki.client.with_suffix(".key")).context()
    with pytest.raises(UsageError, match="--tls-client-ca"):
        TlsConfig(pki.server, key, tmp_path / "no-ca.pem").context()


@pytest.mark.parametrize(
    ("command", "shows"),
    [(["attach", "{pid}"], "driftwatch_target_info"), (["daemon"], "driftwatch_build_info")],
)
def test_attach_and_daemon_serve_https_and_reject_bad_tls_flags(
    pki: Pki, sleeper: subprocess.Popen[bytes], command: list[str], shows: str
) -> None:
    command = [arg.format(pid=sleeper.pid) for arg in command]
    cert, key = str(pki.server), str(pki.server.with_suffix(".key"))
    watching = subprocess.Popen(
        [
            *(sys.executable, "-m", "driftwatch", *command, "--interval", "1"),
            *("--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key),
            *("--tls-client-ca", str(pki.ca)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watching.stderr is not None
        url = re.search(r"metrics at (\S+)", watching.stderr.readline())
        assert url is not None
        assert url.group(1).startswith("https://127.0.0.1:")
        assert shows in scrape(url.group(1), pki.client_context(pki.client))
    finally:
        watching.terminate()
        watching.wait(timeout=30)
    assert watching.returncode == 0
    for flags, needle in [
        (["--tls-cert", cert], "--tls-key"),
        (["--tls-cert", cert, "--tls-key", "/nonexistent.key"], "/nonexistent.key"),
        (["--tls-client-ca", str(pki.ca)], "--tls-client-ca needs"),
    ]:
        assert_one_line_error(run_cli(*command, *flags), needle)


def test_silent_clients_are_dropped_and_do_not_hold_up_scrapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http, "CONNECTION_TIMEOUT_SECONDS", 0.5)
    running = MetricsServer(metrics_app(list), "127.0.0.1", 0)
    try:
        assert get(running.url)[0] == 200
        handlers = threading.active_count()
        silent = [
            socket.create_connection(("127.0.0.1", running.port))
            for _ in range(http.HANDLER_THREADS + 1)
        ]  # more than there are handlers, each connected and never speaking
        began = time.monotonic()
        assert get(running.url)[0] == 200
        assert time.monotonic() - began < 5 * http.CONNECTION_TIMEOUT_SECONDS
        for client in silent:
            client.settimeout(5)
            assert client.recv(1) == b""  # dropped by the server
            client.close()
        assert threading.active_count() <= handlers + http.HANDLER_THREADS  # not one each
    finally:
        running.close()
