"""``fullband eval-controls``: does latent feedback do serial work that controls trained to win cannot?

The full-bandwidth model against a baseline, an equal-FLOPs transformer, a looped transformer with input injection
and an RNN reference on ball-tracking word problems over S5 and A5 (DESIGN.md §7). One package: the settings
(:mod:`.config`), the arms (:mod:`.arms`, :mod:`.models`), one training loop (:mod:`.train`), the study
(:mod:`.study`), the analysis (:mod:`.analysis`) and the report (:mod:`.report`).
"""
