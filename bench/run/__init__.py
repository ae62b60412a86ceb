"""Running jobs and reading them back: one training run, sweeps of runs, and the report over a sweep."""
