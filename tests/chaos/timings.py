"""The crash tests' timings: their workers' and their own settings."""

#: Short enough that a crash test recovers in seconds.
TIMINGS = {"LEASE_SECONDS": 1.5, "DISPATCH_TIMEOUT_SECONDS": 3.0, "REAP_INTERVAL_SECONDS": 0.3}


def timing_env() -> dict[str, str]:
    return {f"KEYED_QUEUE_{name}": str(value) for name, value in TIMINGS.items()}
