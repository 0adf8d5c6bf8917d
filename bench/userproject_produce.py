"""The producer of ``python -m bench.userproject``: copied into the user's project and run there, as fast as it can.

    python bench_produce.py VARIANT PLAN

VARIANT is ``plain`` (``plain_step.apply_async`` in a loop), ``keyed`` (``step.apply_async`` in a loop) or
``bulk`` (one ``step.apply_async_many`` call); PLAN is a JSON file of ``[key, n]`` pairs, submitted in its
order, each as ``(key, n, 0.0)``. No sleeps and no retries: a refused submission fails the run.

Prints one JSON line: ``first`` (time.time() just before the first submission), ``last`` (just after the
last returned), ``cpu`` (this process's CPU seconds between them) and ``ids`` (the task ids, in plan order).
Django and the tasks are imported, and nothing else is done, before ``first``.
"""

import json
import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")


def main(variant: str, plan_path: str) -> None:
    django.setup()
    from shop.tasks import plain_step, step

    with open(plan_path) as f:
        calls = [(key, n, 0.0) for key, n in json.load(f)]
    cpu0 = time.process_time()
    first = time.time()
    if variant == "bulk":
        ids = [result.id for result in step.apply_async_many(calls)]
    else:
        task = step if variant == "keyed" else plain_step
        ids = [task.apply_async(call).id for call in calls]
    last = time.time()
    cpu = time.process_time() - cpu0
    print(json.dumps({"first": first, "last": last, "cpu": cpu, "ids": ids}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("plain", "keyed", "bulk"):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
