"""`fullband recipe`: which ingredient makes latent feedback pay? Compare runs of recipe variants, their report."""

from fullband.experiments.core.registry import StudyCommand

COMMANDS = (StudyCommand(
    "recipe", "Study: each recipe ingredient toggled, widths, gap vs steps: report.",
    config="fullband.experiments.recipe.config:RecipeConfig",
    study="fullband.experiments.recipe.study:RecipeStudy",
    reports={"recipe": "fullband.experiments.recipe.report:report"}),)
