"""`fullband eval-state`: state tracking at the input layer (paper Figure 7): probes, study, report."""
