"""Golden vectors for the minute wire form (see README.md in this directory)."""
