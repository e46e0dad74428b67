"""Process source: memory, CPU, threads, descriptors and I/O of the target, via psutil."""

from __future__ import annotations

from driftwatch.series import Sample
from driftwatch.target import Target, translate_psutil


class ProcessSource:
    """Reads the target's ``psutil.Process`` (kept between ticks) inside one ``oneshot()``."""

    name = "process"

    def __init__(self, target: Target) -> None:
        self._target = target

    def sample(self, now: float) -> list[Sample]:
        target = self._target
        target.check_alive()
        process = target.process
        with translate_psutil(target.pid, "the process statistics"), process.oneshot():
            rss = process.memory_info().rss
            cpu = process.cpu_times()
            threads = process.num_threads()
            fds = process.num_fds()
            io = process.io_counters()
        # read_chars/write_chars exist on Linux only; the stubs do not know the platform.
        read_chars: int = getattr(io, "read_chars", 0)
        write_chars: int = getattr(io, "write_chars", 0)
        values = {
            "rss_bytes": rss,
            "cpu_seconds": cpu.user + cpu.system,
            "threads": threads,
            "open_fds": fds,
            "read_bytes": io.read_bytes,
            "write_bytes": io.write_bytes,
            "read_syscall_bytes": read_chars,
            "write_syscall_bytes": write_chars,
            "nondisk_write_bytes": max(0, write_chars - io.write_bytes),
        }
        return [Sample(series, float(value), now) for series, value in values.items()]

    def close(self) -> None:
        """Nothing to release: the ``psutil.Process`` holds no descriptors."""
