"""The worker's side: a run of a keyed task from its start to its end (``run``), the worker's request
(``request``), local handoff (``handoff``, ``handoff_runs``), a lost broker connection (``reconnect``)
and each attempt's error (``attempt_errors``)."""
