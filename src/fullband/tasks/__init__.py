"""Synthetic tasks the studies train and test on: reasoning traces (:mod:`.reasoning`) and state tracking
(:mod:`.state_tracking`). Pure Python, no torch."""
