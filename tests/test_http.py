from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from driftwatch.errors import ListenError, UsageError
from driftwatch.export.http import DEFAULT_HOST, DEFAULT_PORT, MetricsServer, parse_listen
from driftwatch.export.prometheus import metrics_app


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


def test_default_port_is_outside_the_allocated_exporter_range() -> None:
    assert not 9100 <= DEFAULT_PORT <= 9999
    assert DEFAULT_PORT < 32768  # below Linux's ephemeral range
