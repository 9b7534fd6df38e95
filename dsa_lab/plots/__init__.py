"""Seaborn charts for the notebooks and reports, one module per topic; plots never time anything."""
