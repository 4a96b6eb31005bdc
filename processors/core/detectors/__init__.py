"""Step detectors: each one file with its own small state, listed in `registry`."""
