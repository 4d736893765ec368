"""PVM benchmarks: scripts that print JSON (run them as `python bench/<name>.py --json`)."""
