"""Synthetic tasks the studies train and test on, each a :class:`~fullband.tasks.base.Task` (random examples,
prompt and completion text, an answer checked by code): reasoning traces (:mod:`.reasoning`) and state tracking
(:mod:`.state_tracking`). Pure Python, no torch."""
