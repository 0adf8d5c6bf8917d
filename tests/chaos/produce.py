"""A producer in its own process, for crash tests that move Redis under it.

    python -m tests.chaos.produce QUEUE TASKS KEYS INTERVAL

Submits lingering_step tasks round-robin over KEYS keys, one every INTERVAL
seconds, retrying a submission while the gate is unreachable, and prints one
JSON line per accepted task: {"key", "n", "id"}.
"""

import json
import sys
import time

import django

from django_keyed_queue import GateUnavailable


def main(queue: str, tasks: int, keys: int, interval: float) -> None:
    django.setup()
    from testproject.demo.tasks import lingering_step

    for i in range(tasks):
        key, n = f"restart-{i % keys}", i // keys
        while True:
            try:
                result = lingering_step.apply_async((key, n, 0.05), queue=queue)
                break
            except GateUnavailable:
                time.sleep(0.1)
        print(json.dumps({"key": key, "n": n, "id": result.id}), flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
