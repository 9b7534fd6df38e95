"""Analysis between the store and the charts: which data a notebook shows, and what it means."""
