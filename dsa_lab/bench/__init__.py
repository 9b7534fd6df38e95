"""Timing, sweeps and their command line."""
