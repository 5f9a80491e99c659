"""What every study shares: the study base, its config base, the report writer, statistics, FLOPs, records and
the parallel runner. Names no study."""
