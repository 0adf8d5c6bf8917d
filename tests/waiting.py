"""Waiting on a state in the tests: poll until it holds, never sleep a fixed time."""

import time


def wait_until(predicate, timeout: float = 60, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
