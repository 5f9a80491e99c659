"""``fullband bench``: side-by-side speed of fullband against the peers a user would pick, in one table.

Every figure is a ratio of two things timed in the same process, interleaved round by round (A, B, then B, A, ...),
so drift in machine speed and other load hit both alike; a ratio is the median over rounds of that round's ratio.
The machine's own limits (memory bandwidth of a large tensor copy, matmul FLOP/s) are measured in the same run, so
each absolute figure can also be read as a fraction of what this machine can do. :mod:`.config` holds the options,
:mod:`.timing` the interleaving and the limits, :mod:`.steps` the training and decoding steps timed, :mod:`.run`
the sections and the table.
"""
