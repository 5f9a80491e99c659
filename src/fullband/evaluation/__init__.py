"""Evaluation: perplexity in every inference mode, the stability diagnostic, the token-multiplier fit and the
``fullband compare`` report (import the submodules; nothing heavy is imported here)."""
