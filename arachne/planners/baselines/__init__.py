"""The five baseline planners, re-implemented from their papers and code (docs/baselines.md)."""
