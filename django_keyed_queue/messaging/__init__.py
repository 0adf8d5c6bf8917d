"""A keyed task's message: its stored form (``message``), built by Celery and published (``building``),
and the dispatcher that publishes what the gate grants (``dispatch``). Both sides use it."""
