"""The procrastinate peer of ``python -m bench.userproject``: its task, and its producer. Copied into the user's
project as ``bench_procrastinate.py``; the worker imports it (``PROCRASTINATE_IMPORT_PATHS``), the bench runs it:

    python bench_procrastinate.py procrastinate PLAN

PLAN is a JSON file of ``[key, n]`` pairs, each deferred in its order as ``step.configure(lock=key)`` with
``key=key, n=n, seconds=0.0``: a loop of ``defer`` as fast as it can, no sleeps, no retries. The task's body is
the project's own: ``shop.tasks.logged``, the start and end lines of the plain and keyed tasks.

Prints one JSON line, as bench_produce.py does: ``first``, ``last``, ``cpu`` and ``ids`` (the job ids, in plan
order). Django and the task are imported, and nothing else is done, before ``first``.
"""

import json
import os
import sys
import time

import django
from procrastinate.contrib.django import app

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

#: Named, so that the producer (this file run as a script) and the worker (this file imported) agree.
TASK_NAME = "bench_procrastinate.step"


@app.task(name=TASK_NAME, pass_context=True)
def step(context, key: str, n: int, seconds: float = 0.0) -> int:
    from shop.tasks import logged  # here: the producer imports this file before Django is set up

    return logged(str(context.job.id), key, n, seconds)


def main(plan_path: str) -> None:
    # The task above joined procrastinate's Django app, which is made here (the app is ready).
    django.setup()
    with open(plan_path) as f:
        plan = [(key, n) for key, n in json.load(f)]
    cpu0 = time.process_time()
    first = time.time()
    ids = [step.configure(lock=key).defer(key=key, n=n, seconds=0.0) for key, n in plan]
    last = time.time()
    cpu = time.process_time() - cpu0
    print(json.dumps({"first": first, "last": last, "cpu": cpu, "ids": ids}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "procrastinate":
        sys.exit(__doc__)
    main(sys.argv[2])
