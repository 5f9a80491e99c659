"""The reasoning study's compute-matched controls (`fullband eval-reasoning --controls`, and over families):
the looped and equal-FLOPs models, their study and report."""
