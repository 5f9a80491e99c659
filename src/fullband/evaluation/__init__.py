"""lm-evaluation-harness (the ``eval`` extra), on the application side: it loads models through
:mod:`fullband.families` like every command. Importing :mod:`.adapter` registers the ``fullband`` model with lm-eval;
:mod:`.run` is ``fullband eval``; :mod:`.continuation` scores continuations in every decoding mode."""
