"""A JupyterLab save hook that keeps `git status` clean after a Run All (`./lab jupyter` installs it).

Notebooks are committed without outputs: `.gitattributes` names the nbstripout filter and `./lab`
sets it, so after a Run All `git diff` shows nothing. `git status` would still list the notebook:
git takes a file whose size differs from its index entry as modified without running the filter
(read-cache.c, `ie_modified`). After each save this hook hashes the notebook as the filter commits
it; when that is the indexed blob (only outputs, counts or kernel metadata changed) it refreshes
the entry (`git update-index`, which stores the same blob with the file's new size), so `git status`
agrees with `git diff`; in a thread of its own, since the filter runs twice per save. A notebook
whose cells changed stays modified, as it should.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

_ONE_AT_A_TIME = threading.Lock()  # git's index lock admits one writer; saves of several notebooks queue here


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=120)


def refresh_entry(path: str | Path) -> bool:
    """Refresh `path`'s index entry when the filter would commit what the index holds; True if it did.

    Never raises: outside a checkout, for untracked files, without git, or when git is busy it
    does nothing (the next save tries again).
    """
    path = Path(path)
    if path.suffix != ".ipynb":
        return False
    try:
        with _ONE_AT_A_TIME:
            staged = _git(path.parent, "ls-files", "--stage", "--", path.name).stdout.split()
            if len(staged) < 2:  # not tracked, or not in a checkout
                return False
            filtered = _git(path.parent, "hash-object", f"--path={path.name}", "--", path.name)
            if filtered.returncode != 0 or filtered.stdout.strip() != staged[1]:
                return False
            return _git(path.parent, "update-index", "--", path.name).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def refresh_index(os_path: str, **_: object) -> threading.Thread:
    """jupyter_server's post_save_hook: `refresh_entry` in a thread of its own, so the save returns at
    once (the filter runs twice, seconds on a busy machine, and JupyterLab's autosave backs off after a
    slow save). Returns the thread (tests join it)."""
    thread = threading.Thread(target=refresh_entry, args=(os_path,), name="dsa-lab-git-refresh", daemon=True)
    thread.start()
    return thread
