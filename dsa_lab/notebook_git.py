"""A JupyterLab save hook that keeps `git status` clean after a Run All (`./lab jupyter` installs it).

Notebooks are committed without outputs: `.gitattributes` names the nbstripout filter and `./lab`
sets it, so after a Run All `git diff` shows nothing. `git status` would still list the notebook:
git takes a file whose size differs from its index entry as modified without running the filter
(read-cache.c, `ie_modified`). After each save this hook hashes the notebook as the filter commits
it; when that is the indexed blob (only outputs, counts or kernel metadata changed) it refreshes
the entry (`git update-index`, which stores the same blob with the file's new size), so `git status`
agrees with `git diff`. A notebook whose cells changed stays modified, as it should.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=60)


def refresh_index(os_path: str, **_: object) -> bool:
    """jupyter_server's post_save_hook: True when the saved notebook's index entry was refreshed.

    Never raises (a failing hook would make JupyterLab report the save as failed): outside a
    checkout, for untracked files, without git, or when git is busy it does nothing.
    """
    path = Path(os_path)
    if path.suffix != ".ipynb":
        return False
    try:
        staged = _git(path.parent, "ls-files", "--stage", "--", path.name).stdout.split()
        if len(staged) < 2:  # not tracked, or not in a checkout
            return False
        filtered = _git(path.parent, "hash-object", f"--path={path.name}", "--", path.name)
        if filtered.returncode != 0 or filtered.stdout.strip() != staged[1]:
            return False
        return _git(path.parent, "update-index", "--", path.name).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
