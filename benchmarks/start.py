"""Start times (issue 84): how long `memsvc serve` takes to SERVING, as `make run` starts it,
and whether health answers within its 2 s deadline throughout.

Three kinds of start, `--repeats` times each (medians printed):
- first: a machine that never started memsvc (an empty user cache: the model's ONNX graph
  is built and its runtimes timed) on a new data dir;
- later: the same data dir and cache again;
- new data dir: a machine that started once, on a data dir it never opened.

From spawning the process to the first SERVING answer; health is asked every 0.25 s with a
2 s deadline from the moment the port answers, and the slowest answer and any missed
deadline are reported. Each phase's share comes from the server's startup_phase log lines.
`--load N` keeps N busy processes running beside it (the figure of a shared machine).
Prints a markdown table; not in CI (timings live here, not in tests)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._common import ROOT, machine
from tests.support.launch import free_port

SERVE = ROOT / ".venv" / "bin" / "memsvc"
HEALTH_DEADLINE_S = 2.0


@dataclass
class Start:
    seconds: float
    slowest_health_s: float
    missed_deadlines: int
    slowest_in: str  # the phase the slowest health answer was asked in
    phases: dict[str, float] = field(default_factory=dict)


def _busy() -> None:
    while True:
        pass


def start_once(data_dir: Path, cache: Path, log_path: Path, timeout_s: float = 600) -> Start:
    port, http_port = free_port(), free_port()
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(cache),
        "MEMSVC_METRICS_LISTEN": "",
        "TQDM_DISABLE": "1",
    }
    begun = time.monotonic()
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [
                str(SERVE),
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--http-listen",
                f"127.0.0.1:{http_port}",
                "--data-dir",
                str(data_dir),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    slowest = 0.0
    slowest_at = 0.0
    missed = 0
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if proc.poll() is not None or time.monotonic() - begun > timeout_s:
                    raise RuntimeError(f"no SERVING: see {log_path}")
                asked = time.monotonic()
                try:
                    status = health.Check(
                        health_pb2.HealthCheckRequest(), timeout=HEALTH_DEADLINE_S
                    ).status
                    if time.monotonic() - asked > slowest:
                        slowest, slowest_at = time.monotonic() - asked, asked - begun
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        seconds = time.monotonic() - begun
                        break
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        missed += 1
                        if time.monotonic() - asked > slowest:
                            slowest, slowest_at = time.monotonic() - asked, asked - begun
                time.sleep(0.25)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    marks = _marks(log_path)
    slowest_in = [phase for phase, at in marks if at <= slowest_at][-1]
    return Start(seconds, slowest, missed, slowest_in, _phases(marks, seconds))


def _marks(log_path: Path) -> list[tuple[str, float]]:
    """The log's startup phases and when each began (elapsed_s; before the first,
    importing and opening the ports)."""
    marks: list[tuple[str, float]] = [("importing and opening the ports", 0.0)]
    for line in log_path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "startup_phase":
            marks.append((str(entry["phase"]), float(entry["elapsed_s"])))
    return marks


def _phases(marks: list[tuple[str, float]], total: float) -> dict[str, float]:
    """Seconds per startup phase (the last one runs to SERVING)."""
    spans: dict[str, float] = {}
    for (phase, at), (_, until) in zip(marks, [*marks[1:], ("", total)], strict=True):
        spans[phase] = spans.get(phase, 0.0) + max(0.0, until - at)
    return spans


def run(repeats: int, work: Path) -> dict[str, list[Start]]:
    kinds: dict[str, list[Start]] = {"first": [], "later": [], "new data dir": []}
    for i in range(repeats):
        cache, data = work / f"cache-{i}", work / f"data-{i}"
        kinds["first"].append(start_once(data, cache, work / f"first-{i}.log"))
        kinds["later"].append(start_once(data, cache, work / f"later-{i}.log"))
        kinds["new data dir"].append(start_once(work / f"data-{i}-b", cache, work / f"new-{i}.log"))
    return kinds


def report(kinds: dict[str, list[Start]], load: int) -> str:
    lines = [
        f"Start to SERVING, {machine()}, load: {os.getloadavg()[0]:.1f}"
        f" ({load} busy processes beside it); medians of {len(kinds['first'])}",
        "",
        "| start | to SERVING | each | slowest health answer | missed 2 s deadlines |"
        " longest phase |",
        "|---|---:|---|---:|---:|---|",
    ]
    for kind, starts in kinds.items():
        seconds = statistics.median(s.seconds for s in starts)
        each = ", ".join(f"{s.seconds:.1f}" for s in starts)
        worst = max(starts, key=lambda s: s.slowest_health_s)
        missed = sum(s.missed_deadlines for s in starts)
        phases: dict[str, list[float]] = {}
        for s in starts:
            for phase, spent in s.phases.items():
                phases.setdefault(phase, []).append(spent)
        longest = max(phases, key=lambda p: statistics.median(phases[p]))
        lines.append(
            f"| {kind} | {seconds:.1f} s | {each} | {worst.slowest_health_s:.2f} s"
            f" ({worst.slowest_in}) | {missed} |"
            f" {longest}: {statistics.median(phases[longest]):.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the server")
    parser.add_argument("--keep", type=Path, help="keep the data dirs, caches and logs here")
    args = parser.parse_args()
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for p in busy:
        p.start()
    try:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            kinds = run(args.repeats, args.keep)
        else:
            with tempfile.TemporaryDirectory(prefix="bench-start-") as work:
                kinds = run(args.repeats, Path(work))
        print(report(kinds, args.load))
    finally:
        for p in busy:
            p.terminate()


if __name__ == "__main__":
    main()
