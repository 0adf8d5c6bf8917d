"""What the producers of test_coalesce_idempotency run: coalescing submissions with idempotency keys.

Not a test module: the test runs it as a process of its own,

    python -m tests.django._coalescing_producers < plan.json

which sets Django up, opens no connection, and forks the plan's producers: each a process of its own
that connects itself and submits its items (``[key, n, idempotency key, task id or null]``, each
``latest_step.apply_async((key, n), ...)``). A round's producers start together (one pipe is their
starting signal) or, with ``one_at_a_time``, each after the last ended. With ``killed_at_hand_over``,
a producer is SIGKILLed right after the gate's call that replaced a waiting task, before its own
hand-over (``messaging.superseded.replaced``): as a producer that dies there. It prints, as JSON, each
round's ids per producer (None for one killed) and each producer's exit status (a negative signal number
for one killed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from typing import Any

import django


def main(plan: dict[str, Any]) -> dict[str, Any]:
    django.setup()
    from django.conf import settings

    for name, value in plan["settings"].items():
        setattr(settings, name, value)
    # Imported here, before any fork: each producer only connects.
    import testproject.demo.tasks  # noqa: F401
    from django_keyed_queue.messaging import superseded  # noqa: F401

    rounds = []
    for round_ in plan["rounds"]:
        producers = round_["producers"]
        if round_.get("one_at_a_time"):
            ran = [_run([items], round_)[0] for items in producers]
        else:
            ran = _run(producers, round_)
        rounds.append(ran)
    return {"rounds": rounds}


def _run(producers: list[list[list[Any]]], round_: dict[str, Any]) -> list[dict[str, Any]]:
    """Fork one process per list of items, start them together, wait for each; what each reported."""
    go_read, go_write = os.pipe()
    out_read, out_write = os.pipe()
    pids = []
    for i, items in enumerate(producers):
        pid = os.fork()
        if pid == 0:  # the producer
            os.close(go_write)
            os.close(out_read)
            _produce(i, items, round_.get("killed_at_hand_over", False), go_read, out_write)
        pids.append(pid)
    os.close(go_read)
    os.close(out_write)
    os.write(go_write, b"x" * len(producers))
    os.close(go_write)
    with os.fdopen(out_read) as out:
        reported = {line["producer"]: line for line in map(json.loads, out)}
    ran = []
    for i, pid in enumerate(pids):
        _, status = os.waitpid(pid, 0)
        line = reported.get(i, {})
        if "error" in line:
            raise RuntimeError(f"producer {i} failed:\n{line['error']}")
        exit_status = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        ran.append({"ids": line.get("ids"), "exit": exit_status})
    return ran


def _produce(i: int, items: list[list[Any]], killed_at_hand_over: bool, go: int, out: int) -> None:
    try:
        from django_keyed_queue.messaging import superseded
        from testproject.demo.tasks import latest_step
        from tests.django.queues import QUEUE

        if killed_at_hand_over:
            superseded.replaced = _killed  # type: ignore[assignment]
        os.read(go, 1)
        ids = []
        for key, n, idempotency_key, task_id in items:
            options = {"task_id": task_id} if task_id else {}
            ids.append(latest_step.apply_async((key, n), queue=QUEUE, idempotency_key=idempotency_key, **options).id)
        line = {"producer": i, "ids": ids}
        status = 0
    except BaseException:
        line, status = {"producer": i, "error": traceback.format_exc()}, 1
    os.write(out, (json.dumps(line) + "\n").encode())  # one write, under PIPE_BUF: lines do not interleave
    os._exit(status)


def _killed(*args: Any, **kwargs: Any) -> None:
    """The producer's hand-over of the task its submission replaced: it dies there instead."""
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    print(json.dumps(main(json.load(sys.stdin))), flush=True)
