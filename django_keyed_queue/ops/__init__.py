"""The operator's side: ``actions`` (what an operator, the reaper or recovery does, each action's rules
in one home) and ``console`` (what the operator sees: the admin, the live keys page, explain, health,
metrics), which calls them; ``display`` writes a moment and a span of time for both."""
