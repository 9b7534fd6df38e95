"""Research done with the library: one past issue's goals, the lab notes' tuning rounds, one round's timelines.

A study reads the library (runs, frames, charts) and takes the runs and folders it reads as
parameters; notebooks pass the shipped ones. Nothing in the library imports a study.
"""
