"""Where the worker's CPU goes, piece by piece: ``bench.userproject --profile DIR``.

During each measured many-keys round, ``py-spy`` samples the worker's main process and its pool
processes (``--subprocesses``, ``--nonblocking``: never paused) and writes their stacks to
``DIR/<workload>-<variant>-<round>.txt`` (py-spy's collapsed format: one stack a line, with its
count). It samples with ``--gil``: only the thread holding a process's GIL, so a thread blocked on a
socket, a pipe or a lock is not counted. A thread holding the GIL while it waits for a core is, so the
samples give each piece's share of a process group's time, not its CPU: each share is applied to the
CPU the bench measured for that group in the same rounds (from /proc), giving ms of CPU per task.

Each stack goes to one piece: walking from its innermost frame out, the first frame one of ``PIECES``
names. Redis's client, JSON and kombu's serializers count under whoever called them (the keyed
queue's gate calls under the start or finish that made them); a stack none names, but with a frame of
the keyed queue's, is "keyed: other". py-spy runs on the same cores as the worker, so a profiled
run's throughput is not a benchmark figure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Samples a second per process.
RATE = 100

#: (piece, a part of a frame that marks it): a stack is the piece of its innermost frame found here.
PIECES: list[tuple[str, str]] = [
    ("keyed: start at the gate", "django_keyed_queue/worker/run_start.py"),
    ("keyed: a run's start, end and retry", "django_keyed_queue/worker/run.py"),
    ("keyed: local handoff", "django_keyed_queue/worker/handoff"),
    ("keyed: records", "django_keyed_queue/records/"),
    ("keyed: lease keeper", "django_keyed_queue/process/leases.py"),
    ("keyed: counts for metrics", "django_keyed_queue/process/totals.py"),
    ("keyed: signal handlers", "django_keyed_queue/wiring/signals.py"),
    ("task body", "shop/tasks.py"),
    ("celery: tracer", "celery/app/trace.py"),
    ("celery: pool (billiard)", "billiard/"),
    # Last: a child process's stacks start in the worker's (forked from it), and kombu's serializers serve
    # whoever calls them; in the main process this is its consumer, kombu's transport included.
    ("celery: worker (consumer)", "celery/worker/"),
]
#: A stack no piece names, with a frame of the keyed queue's.
KEYED_OTHER = ("keyed: other", "django_keyed_queue/")

#: The worker's processes, named as the bench's CPU lines name them.
GROUPS = ("worker main", "child processes")

_PROCESS = re.compile(r'^process (\d+):"')


@contextmanager
def sampled(pid: int, output: Path) -> Iterator[None]:
    """py-spy sampling ``pid`` and its children into ``output`` while the block runs."""
    spy = shutil.which("py-spy", path=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))
    if spy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    command = [spy, "record", "--pid", str(pid), "--subprocesses", "--gil", "--nonblocking", "--rate", str(RATE)]
    command += ["--format", "raw", "--output", str(output)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)  # py-spy writes what it sampled on an interrupt
        _, err = process.communicate(timeout=60)
        if not output.exists():
            print(f"py-spy wrote no profile to {output}: {err[-500:]}")


def piece_of(frames: list[str]) -> str:
    """The piece of a stack, its frames outermost first."""
    for frame in reversed(frames):
        for piece, mark in PIECES:
            if mark in frame:
                return piece
    return KEYED_OTHER[0] if any(KEYED_OTHER[1] in frame for frame in frames) else "other"


def samples(path: Path, main_pid: int) -> dict[str, Counter[str]]:
    """Samples per piece in the profile at ``path``, for the worker's main process and its child processes."""
    counts: dict[str, Counter[str]] = {group: Counter() for group in GROUPS}
    # Only "\n" ends a line: a frame read while its process changed it (--nonblocking) may hold any character.
    for line in path.read_text(errors="replace").split("\n"):
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():  # such a torn read, or the end: not a sample
            continue
        frames = stack.split(";")
        # --subprocesses puts the process's ancestry first: "process <main>;process <child process>;frames".
        processes = [m for m in map(_PROCESS.match, frames) if m]
        main = not processes or int(processes[-1].group(1)) == main_pid
        counts[GROUPS[0] if main else GROUPS[1]][piece_of(frames[len(processes) :])] += int(count)
    return counts


def report(profiles: list[tuple[str, Path, int, int, dict[str, float]]]) -> None:
    """Per variant, summed over its rounds: each piece's ms of CPU per task, its share of its group's
    samples applied to the group's measured CPU.

    ``profiles``: (variant, profile path, the worker's main pid, the round's tasks, its measured CPU
    seconds by group)."""
    pieces: dict[str, dict[str, Counter[str]]] = {}
    cpu_ms: dict[str, Counter[str]] = {}
    tasks: Counter[str] = Counter()
    for variant, path, main_pid, n, cpu in profiles:
        if not path.exists():
            continue
        into = pieces.setdefault(variant, {group: Counter() for group in GROUPS})
        for group, counts in samples(path, main_pid).items():
            into[group].update(counts)
        cpu_ms.setdefault(variant, Counter()).update({group: cpu.get(group, 0.0) * 1000 for group in GROUPS})
        tasks[variant] += n
    if not pieces:
        return
    variants = list(pieces)
    print(f"\nCPU per task by piece, ms (measured CPU of each group, shared as py-spy --gil's {RATE} Hz samples):")
    for group in GROUPS:
        print(f"  {group:<34}" + "".join(f"{variant:>14}" for variant in variants))

        def ms(variant: str, piece: str, group: str = group) -> float:
            counted = pieces[variant][group]
            total = sum(counted.values())
            return cpu_ms[variant][group] * counted[piece] / total / tasks[variant] if total else 0.0

        names = {piece for variant in variants for piece in pieces[variant][group]}
        for piece in sorted(names, key=lambda p: -max(ms(v, p) for v in variants)):
            print(f"    {piece:<32}" + "".join(f"{ms(v, piece):>14.3f}" for v in variants))
        print(f"    {'all':<32}" + "".join(f"{cpu_ms[v][group] / tasks[v]:>14.3f}" for v in variants))
