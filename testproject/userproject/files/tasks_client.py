"""A client of the project's Django tasks, for the tests: one JSON command a line on stdin, one JSON answer
a line on stdout. Commands: ``{"enqueue": TASK, "args": [...], "kwargs": {...}, "using": {...}}`` (``using``'s
``run_after`` in seconds from now), ``{"enqueue_odd": TASK, "case": NAME}`` (arguments JSON cannot carry),
``{"get": TASK, "id": ID}`` and ``{"aget": TASK, "id": ID}``. An error answers ``{"error": CLASS, "message": ...}``.
"""

import asyncio
import json
import os
import sys
from datetime import timedelta

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

#: Arguments of django_step JSON cannot carry as they are, or that make no usable key or message.
ODD = {
    "nan": lambda: (("k", float("nan")), {}),
    "set": lambda: (("k", {1, 2}), {}),
    "object": lambda: (("k", object()), {}),
    "int dict key": lambda: (("k", {1: "one"}), {}),
    "nul in key": lambda: (("a\x00b", 1), {}),
    "empty key": lambda: (("", 1), {}),
    "key too long": lambda: (("k" * 5000, 1), {}),
    "missing argument": lambda: (("k",), {}),
    "unknown argument": lambda: (("k", 1), {"colour": "red"}),
    "too many": lambda: (("k", 1, 0.0, "extra"), {}),
    # Over KEYED_QUEUE_MAX_MESSAGE_BYTES (1 MiB).
    "huge message": lambda: (("k", "x" * 1_100_000), {}),
}


def shown(result) -> dict:
    try:
        value, value_error = result.return_value, None
    except ValueError as exc:
        value, value_error = None, str(exc)
    return {
        "id": result.id,
        "status": str(result.status),
        "enqueued_at": result.enqueued_at and result.enqueued_at.timestamp(),
        "started_at": result.started_at and result.started_at.timestamp(),
        "last_attempted_at": result.last_attempted_at and result.last_attempted_at.timestamp(),
        "finished_at": result.finished_at and result.finished_at.timestamp(),
        "errors": [[e.exception_class_path, e.traceback, e.exception_class.__name__] for e in result.errors],
        "return_value": value,
        "return_value_error": value_error,
        "attempts": result.attempts,
        "args": result.args,
        "kwargs": result.kwargs,
        "task": result.task.module_path,
    }


def answer(command: dict) -> dict:
    from django.utils import timezone
    from shop import tasks

    if "enqueue" in command:
        task = getattr(tasks, command["enqueue"])
        using = dict(command.get("using") or {})
        if "run_after" in using:
            using["run_after"] = timezone.now() + timedelta(seconds=using["run_after"])
        if using:
            task = task.using(**using)
        return shown(task.enqueue(*command.get("args", []), **command.get("kwargs", {})))
    if "enqueue_odd" in command:
        args, kwargs = ODD[command["case"]]()
        return shown(getattr(tasks, command["enqueue_odd"]).enqueue(*args, **kwargs))
    if "get" in command:
        return shown(getattr(tasks, command["get"]).get_result(command["id"]))
    if "aget" in command:
        return shown(asyncio.run(getattr(tasks, command["aget"]).aget_result(command["id"])))
    raise ValueError(f"unknown command {command!r}")


def main() -> None:
    django.setup()
    for line in sys.stdin:
        try:
            reply = answer(json.loads(line))
        except Exception as exc:
            reply = {"error": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
