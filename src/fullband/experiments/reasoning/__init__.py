"""`fullband eval-reasoning`: shorter reasoning traces at equal accuracy? Its data, evaluation, report and its
compute-matched controls (:mod:`.controls`)."""
