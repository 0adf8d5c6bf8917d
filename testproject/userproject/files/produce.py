"""Submit TASKS steps round-robin over KEYS keys (PREFIX:0, PREFIX:1 ...), one every INTERVAL seconds.

    python produce.py TASK TASKS KEYS INTERVAL SECONDS [PREFIX]

Each step lasts SECONDS, or a random time between LOW and HIGH when SECONDS is ``LOW-HIGH``; when
SECONDS is a list (``8,0.1``), step i lasts its i-th, and the rest its last.

A submission refused while Redis is away is tried again. Prints one JSON line per
accepted task: {"key", "n", "id", "t"}.
"""

import json
import os
import random
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")


def main(task_name: str, tasks: int, keys: int, interval: float, seconds: str, prefix: str = "acct") -> None:
    django.setup()
    from kombu.exceptions import OperationalError
    from shop import tasks as shop_tasks

    from django_keyed_queue import GateUnavailable

    task = getattr(shop_tasks, task_name)
    low, _, high = seconds.partition("-")
    listed = [] if high else [float(s) for s in seconds.split(",")]
    durations = random.Random(tasks)
    for i in range(tasks):
        key, n = f"{prefix}:{i % keys}", i // keys
        duration = durations.uniform(float(low), float(high)) if high else listed[min(i, len(listed) - 1)]
        while True:
            try:
                result = task.delay(key, n, duration)
                break
            except (GateUnavailable, OperationalError):
                time.sleep(0.1)
        print(json.dumps({"key": key, "n": n, "id": result.id, "t": time.time()}), flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], *sys.argv[6:7])
