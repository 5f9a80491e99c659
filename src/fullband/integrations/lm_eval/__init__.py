"""lm-evaluation-harness (the ``eval`` extra): importing :mod:`.adapter` registers the ``fullband`` model with
lm-eval; :mod:`.run` is ``fullband eval``; :mod:`.continuation` scores continuations in every decoding mode."""
