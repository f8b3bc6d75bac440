"""What a run leaves behind: the run directory's tables, manifest and plots."""
