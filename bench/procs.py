"""Starting, sampling and always stopping the processes of a run.

Every child runs in its own session (its own process group), so one ``killpg`` takes it and
anything it forked; :class:`Processes` stops them on exit from its ``with`` block, whatever
the reason, and an ``atexit`` hook catches anything left over.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

_LIVE: set[subprocess.Popen[bytes]] = set()


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
    stop_many([proc], grace)


def stop_many(procs: list[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """SIGTERM every group at once, then SIGKILL whatever is left after ``grace`` seconds."""
    for proc in procs:
        if proc.poll() is None:
            _kill_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait(5)
        # The leader may be gone while a forked child lingers in its group.
        _kill_group(proc, signal.SIGKILL)
        _LIVE.discard(proc)


@atexit.register
def _stop_leftovers() -> None:
    stop_many(list(_LIVE), grace=1.0)


@dataclass
class Sample:
    """What the sampler saw of one process: peak RSS and the latest CPU seconds."""

    peak_rss: int = 0
    cpu: float = 0.0


@dataclass
class Beat:
    """One ``celery beat`` replica."""

    name: str
    popen: subprocess.Popen[bytes]
    spawned: float
    mark: Path
    log: Path
    sample: Sample = field(default_factory=Sample)

    def marks(self) -> dict[str, float]:
        """Wall time of each event the app module marked (``beat_init``, ``first_tick``)."""
        try:
            lines = self.mark.read_text().splitlines()
        except FileNotFoundError:
            return {}
        out: dict[str, float] = {}
        for line in lines:
            stamp, _, event = line.partition(" ")
            out.setdefault(event, float(stamp))
        return out

    def mark_time(self, event: str) -> float | None:
        return self.marks().get(event)

    def last_mark(self) -> float | None:
        return max(self.marks().values(), default=None)


class Processes:
    """Owns every process of one run; stops all of them when the block exits."""

    def __init__(self, workdir: Path, sample_every: float = 0.2) -> None:
        self.workdir = workdir
        self.beats: list[Beat] = []
        self.others: list[subprocess.Popen[bytes]] = []
        self._every = sample_every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, daemon=True)

    def __enter__(self) -> Processes:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def spawn(
        self, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _LIVE.add(proc)
        return proc

    def spawn_beat(self, name: str, scheduler: str, loglevel: str, env: dict[str, str]) -> Beat:
        home = self.workdir / name
        home.mkdir(parents=True, exist_ok=True)
        mark, log = home / "booted", home / "beat.log"
        celery = str(Path(sys.executable).with_name("celery"))
        argv = [celery, "-A", "benchapp", "beat", "-S", scheduler, "-l", loglevel]
        argv += ["-s", str(home / "celerybeat-schedule")]
        spawned = time.time()
        proc = self.spawn(argv, log, {**env, "BENCH_REPLICA": name, "BENCH_MARK_FILE": str(mark)})
        beat = Beat(name=name, popen=proc, spawned=spawned, mark=mark, log=log)
        self.beats.append(beat)
        return beat

    def cpu_total(self) -> float:
        """CPU seconds (user + system) used so far by all beats of the run."""
        self._sample_once()
        return sum(b.sample.cpu for b in self.beats)

    def wait_booted(self, timeout: float) -> bool:
        """Wait until every beat has sent beat_init; False on timeout or if one died."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(b.mark_time("beat_init") is not None for b in self.beats):
                return True
            if any(b.popen.poll() is not None for b in self.beats):
                return False
            time.sleep(0.05)
        return False

    def stop_all(self) -> None:
        self._sample_once()
        self._done.set()
        stop_many([b.popen for b in self.beats] + self.others)

    def _sample_once(self) -> None:
        for beat in self.beats:
            try:
                procs = [psutil.Process(beat.popen.pid)]
                procs += procs[0].children(recursive=True)
                rss = cpu = 0.0
                for p in procs:
                    with p.oneshot():
                        rss += p.memory_info().rss
                        times = p.cpu_times()
                        cpu += times.user + times.system
            except psutil.Error:
                continue
            beat.sample.peak_rss = max(beat.sample.peak_rss, int(rss))
            beat.sample.cpu = max(beat.sample.cpu, cpu)

    def _sample_loop(self) -> None:
        while not self._done.wait(self._every):
            self._sample_once()
