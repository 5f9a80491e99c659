"""`fullband recipe`: which ingredient makes latent feedback pay? Compare runs of recipe variants, their report."""
