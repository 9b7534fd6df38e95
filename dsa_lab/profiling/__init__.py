"""The profiling implementation behind `dsa_lab.profile` (see that module for the API)."""
