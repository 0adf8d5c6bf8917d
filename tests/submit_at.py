"""Submit one idempotent charge at a given instant, from a process of its own.

    python -m tests.submit_at UNIX_TIME ORDER_ID

Prints the id of the task the submission resolved to.
"""

import sys
import time

import django


def main(at: float, order_id: int) -> None:
    django.setup()
    from testproject.demo.tasks import charge

    time.sleep(max(0.0, at - time.time()))
    print(charge.delay(order_id, "5.00").id, flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]))
