"""``listen=``: the training process serves its own ``/metrics``, no daemon needed.

A background thread runs the same monitor ``driftwatch attach`` would, on this process and
on the hook's own channel. Problems here are logged, never raised into training.
"""

from __future__ import annotations

import logging
import os
import threading

from driftwatch.channel.env import rank_from
from driftwatch.channel.ring import ChannelWriter, NullWriter
from driftwatch.commands.session import Session, SessionOptions
from driftwatch.errors import DriftwatchError
from driftwatch.export.http import TlsConfig, parse_listen
from driftwatch.runtime.monitor import Monitor, watch
from driftwatch.runtime.snapshot import Snapshot
from driftwatch.sources import Source
from driftwatch.sources.hook import HookSource
from driftwatch.sources.process import ProcessSource
from driftwatch.target.process import Target

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_SECONDS = 2.0


class InProcessServer:
    def __init__(self, session: Session, monitor: Monitor) -> None:
        self._stop = threading.Event()
        self._session = session
        self._thread = threading.Thread(
            target=watch,
            args=(monitor, SAMPLE_INTERVAL_SECONDS, self._stop),
            name="driftwatch-sampler",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return self._session.url

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._session.close()


def serve_in_process(
    writer: ChannelWriter | NullWriter, run: str, listen: str, tls: TlsConfig | None = None
) -> InProcessServer | None:
    """Start sampling this process and serving ``/metrics`` on ``listen`` (HTTPS with
    ``tls``); None on failure."""
    monitor: Monitor | None = None

    def snapshots() -> list[Snapshot]:
        return [] if monitor is None else [monitor.snapshot]

    try:
        host, port = parse_listen(listen)
        target = Target.attach(os.getpid())
        sources: list[Source] = [ProcessSource(target)]
        if isinstance(writer, ChannelWriter):
            sources.append(HookSource(writer.path))
        context = None if tls is None else tls.context()
        session = Session(SessionOptions(host, port, tls=context), run, snapshots)
    except DriftwatchError as err:
        log.warning("driftwatch: not serving /metrics from this process: %s", err)
        return None
    monitor = session.monitor(run, target.info, sources, rank=rank_from(os.environ))
    log.info("driftwatch: serving %s", session.url)
    return InProcessServer(session, monitor)
