"""`fullband compare`: does latent feedback buy training tokens? Its config, study, analyses (per-mode scores,
stability, multipliers, gap trend) and report."""
