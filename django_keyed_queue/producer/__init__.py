"""The producer's side: what ``apply_async`` and its kin do in the process that submits a keyed task."""
