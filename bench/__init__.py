"""The benchmarks and the crash soak, each run from the repo root as ``python -m bench.<name>``."""
