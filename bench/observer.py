"""The queue observer: a separate process that drains the broker's Redis list.

It blocks on BRPOP while the queue is idle (arrival times to well under a millisecond), then
drains whatever else is queued in chunks with an atomic ``LRANGE`` + ``LTRIM`` (one MULTI), so
it keeps up with bursts far faster than any beat publishes (``raw`` measures its drain rate).
Raw messages are kept in memory and parsed only after the run, off the hot loop.

    python -m bench.observer --url redis://127.0.0.1:6379/9 --queue celery \
        --until EPOCH --out arrivals.json

It stops at ``--until`` or on SIGTERM, whichever is first, then writes one JSON object:
``{"messages": [[arrival, task_id, schedule_index, occurrence_key_or_null, origin], ...]}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import redis

from bench.procs import Processes
from bench.services import python_path

CHUNK = 5000


class Message(NamedTuple):
    """One message the observer received."""

    t: float  # arrival, time.time()
    task_id: str
    index: int | None  # the schedule: args[0]
    occurrence: str | None  # voltro_occurrence header
    origin: str | None  # the publishing process


def parse(raw: bytes) -> tuple[str, int | None, str | None, str | None]:
    """Task id, schedule index (``args[0]``), voltro occurrence key and origin of a message.

    ``origin`` is Celery's ``gen<pid>@<host>`` of the publishing process: it tells which
    replica sent a message, where the incumbents give no occurrence identity.
    """
    msg = json.loads(raw)
    headers = msg.get("headers") or {}
    index: int | None = None
    argsrepr = headers.get("argsrepr")
    if isinstance(argsrepr, str) and argsrepr.startswith("[") and argsrepr.endswith("]"):
        try:
            index = int(argsrepr[1:-1])
        except ValueError:
            index = None
    if index is None:  # no argsrepr: decode protocol 2's body, [args, kwargs, embed]
        body = msg.get("body", "")
        if msg.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        index = int(args[0]) if args else None
    return str(headers.get("id")), index, headers.get("voltro_occurrence"), headers.get("origin")


def observe(url: str, queue: str, until: float, ready: Path | None) -> list[tuple[float, bytes]]:
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    client = redis.Redis.from_url(url)
    client.ping()
    if ready is not None:
        ready.write_text(f"{time.time():.6f}\n")
    got: list[tuple[float, bytes]] = []
    while not stopping and (left := until - time.time()) > 0:
        item = client.brpop([queue], timeout=min(0.1, max(left, 0.01)))
        if item is None:
            continue
        got.append((time.time(), item[1]))
        while True:
            pipe = client.pipeline(transaction=True)
            pipe.lrange(queue, -CHUNK, -1)
            pipe.ltrim(queue, 0, -CHUNK - 1)
            batch, _ = pipe.execute()
            now = time.time()
            # LPUSH puts the newest at the head: the tail chunk, reversed, is oldest first.
            got.extend((now, raw) for raw in reversed(batch))
            if len(batch) < CHUNK:
                break
    client.close()
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--queue", default="celery")
    ap.add_argument("--until", type=float, required=True, help="epoch seconds to stop at")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ready", type=Path, help="file written once connected")
    args = ap.parse_args(argv)
    got = observe(args.url, args.queue, args.until, args.ready)
    rows = [[round(t, 6), *parse(raw)] for t, raw in got]
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"messages": rows}))
    tmp.replace(args.out)
    return 0


def start(
    procs: Processes, url: str, queue: str, until: float, out: Path, timeout: float = 15.0
) -> subprocess.Popen[bytes]:
    """Start an observer process under ``procs`` and wait until it is connected."""
    ready = out.with_suffix(".ready")
    argv = [sys.executable, "-m", "bench.observer", "--url", url, "--queue", queue]
    argv += ["--until", f"{until:.6f}", "--out", str(out), "--ready", str(ready)]
    proc = procs.spawn(argv, out.with_suffix(".log"), {"PYTHONPATH": python_path()})
    procs.others.append(proc)
    deadline = time.time() + timeout
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"observer did not start; see {out.with_suffix('.log')}")
        time.sleep(0.02)
    return proc


def finish(proc: subprocess.Popen[bytes], out: Path, timeout: float = 120.0) -> None:
    """Ask an observer to stop now (SIGTERM) and wait until it wrote its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout)
    if not out.exists():
        raise RuntimeError(f"observer wrote no output; see {out.with_suffix('.log')}")


def load(path: Path) -> list[Message]:
    """Read an observer's output file."""
    rows = json.loads(path.read_text())["messages"]
    return [Message(float(t), str(i), n, occ, origin) for t, i, n, occ, origin in rows]


if __name__ == "__main__":
    sys.exit(main())
