"""Run folders and what they hold: `folders` (a run's files, locks, resume), `format` (what a run file must hold,
checked on every read), `writes` (whole files, never through a link), `provenance` (where a run came from) and
`listing` (`dsa-lab runs`). The face hands on what notebooks and users reach for."""

from dsa_lab.store.folders import Run, is_scratch, load_run, read_provenance
from dsa_lab.store.format import RunFormatError
from dsa_lab.store.listing import list_runs
from dsa_lab.store.opening import require_run

__all__ = ["Run", "RunFormatError", "is_scratch", "list_runs", "load_run", "read_provenance", "require_run"]
