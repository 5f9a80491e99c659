"""Studies: ``fullband compare`` (does feedback buy training tokens?), the recipe ablation, the reasoning and
state-tracking studies; each trains several models, evaluates them and writes report.md, results.json and plots
(import the submodules; nothing heavy is imported here)."""
