"""What a notebook shows around its charts: `display` (setup, notes, banners, provenance) and `git_hook` (the
JupyterLab save hook that keeps `git status` clean). The face hands on `display`'s helpers, imported when first
asked for, so the save hook, which JupyterLab's server imports, does not load torch and the analysis."""

from importlib import import_module
from typing import Any

_DISPLAY = {
    "announce",
    "announce_profile",
    "announce_section",
    "note",
    "setup_notebook",
    "show_fallback",
    "show_ignored",
    "show_provenance",
    "show_answer",
    "show_run",
    "show_sm100",
}


def __getattr__(name: str) -> Any:
    if name in _DISPLAY:
        return getattr(import_module("dsa_lab.notebook.display"), name)
    raise AttributeError(f"module 'dsa_lab.notebook' has no attribute {name!r}")
