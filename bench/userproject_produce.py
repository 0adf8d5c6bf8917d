"""The producer of ``python -m bench.userproject``: copied into the user's project and run there, as fast as it can.

    python bench_produce.py VARIANT PLAN [WORKLOAD]

VARIANT is ``plain`` (the plain ``@shared_task``'s ``apply_async`` in a loop), ``keyed`` (the keyed task's
``apply_async`` in a loop), ``bulk`` (one ``apply_async_many`` call of the keyed task), ``results`` (a plain
task that stores its result, in a loop) or, noop only, ``pooled`` (the keyed task of a pool with room,
in a loop). WORKLOAD picks the tasks: ``noop`` (the default: ``plain_step``, ``step``, ``plain_step_stored``,
``roomy_step``) or ``realistic`` (``plain_sync_step``, ``sync_step``, ``plain_sync_step_stored``).
PLAN is a JSON file of ``[key, n]`` pairs (noop), each submitted as ``(key, n, 0.0)``, or of ``[key, n,
account_id]`` (realistic), submitted as they are; in its order. No sleeps and no retries: a refused submission
fails the run.

Prints one JSON line: ``first`` (time.time() just before the first submission), ``last`` (just after the
last returned), ``cpu`` (this process's CPU seconds between them), ``ids`` (the task ids, in plan order) and
``submitted`` (time.time() just before each submission, in plan order; empty for ``bulk``, one call).
Django and the tasks are imported, and nothing else is done, before ``first``.
"""

import json
import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

#: Each workload's task per variant, by its name in shop/tasks.py (``bulk`` submits the keyed one).
TASKS = {
    "noop": {"plain": "plain_step", "keyed": "step", "results": "plain_step_stored", "pooled": "roomy_step"},
    "realistic": {"plain": "plain_sync_step", "keyed": "sync_step", "results": "plain_sync_step_stored"},
}


def main(variant: str, plan_path: str, workload: str) -> None:
    django.setup()
    from shop import tasks

    task = getattr(tasks, TASKS[workload]["keyed" if variant == "bulk" else variant])
    with open(plan_path) as f:
        calls = [(*entry, 0.0) if workload == "noop" else tuple(entry) for entry in json.load(f)]
    ids, submitted = [], []
    cpu0 = time.process_time()
    first = time.time()
    if variant == "bulk":
        ids = [result.id for result in task.apply_async_many(calls)]
    else:
        for call in calls:
            submitted.append(time.time())
            ids.append(task.apply_async(call).id)
    last = time.time()
    cpu = time.process_time() - cpu0
    print(json.dumps({"first": first, "last": last, "cpu": cpu, "ids": ids, "submitted": submitted}), flush=True)


if __name__ == "__main__":
    if not 3 <= len(sys.argv) <= 4:
        sys.exit(__doc__)
    workload = sys.argv[3] if len(sys.argv) == 4 else "noop"
    if workload not in TASKS or sys.argv[1] not in (*TASKS[workload], "bulk"):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], workload)
