"""The HTML report: `execute` (the notebooks through papermill), `cli` (`dsa-lab report`) and `page` (the index:
the headline of the run it shows and the answers per workload)."""
