"""Language-model runs that studies share: the config and presets, ``fullband train`` runs scored in every decoding
mode, the stability diagnostic, and the token multipliers read off a baseline curve."""
