"""JupyterLab in headless Chromium, for tests/test_browser.py: the server, the browser, and the checks.

`LabServer` runs JupyterLab from this interpreter's environment (the project venv under
`./lab test`) on 127.0.0.1 with a free port and a random token, isolated from the user's
Jupyter configuration, and stops it by its own PID. `browser_missing` says why the browser
test cannot run here; `image_problem` says why a chart's PNG is blank. The explorer convention's
selectors live here too; one notebook driven through the UI is tests/notebook_page_support.py.
"""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REQUIRE_ENV = "DSA_LAB_REQUIRE_BROWSER"  # set by .ci/run: a missing browser fails instead of skipping
CHROMIUM_ENV = "DSA_LAB_CHROMIUM"  # a browser executable to use instead of the one on PATH
CHROMIUM_NAMES = ("chromium", "chromium-browser")

# Explorer convention (dsa_lab/explorers/): the box, the Dropdown the test moves, the output area,
# and the one-line error an explorer shows for an invalid combination.
EXPLORER = ".dsa-lab-explorer"
PROBE = ".dsa-lab-explorer-probe select"
OUTPUT = ".dsa-lab-explorer-output"
EXPLORER_ERROR = ".dsa-lab-error"
TRACEBACK_MARK = "Traceback (most recent call last)"
SELECTS = "select:not([multiple])"  # an explorer's Dropdowns (a SelectMultiple is a <select multiple>)
# A chart is blank when its pixels barely vary: a white (or one-colour) PNG. A real chart's text and lines
# give a standard deviation of tens (0-255 scale); a blank one 0, or below 1 with antialiased noise.
MIN_PIXEL_STD = 2.0
MIN_INK_SHARE = 0.002  # and at least this share of pixels differ from the background (the commonest colour)


# JupyterLab user settings for the test server: never save a notebook (autosave would write
# outputs into notebooks/), keep every cell in the DOM, no news pop-up over the screenshots.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def find_chromium() -> str | None:
    """The Chromium executable: $DSA_LAB_CHROMIUM, else `chromium` (Debian) on PATH."""
    chosen = os.environ.get(CHROMIUM_ENV)
    if chosen:
        return chosen if Path(chosen).is_file() else None
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def browser_missing() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    if find_chromium() is None:
        where = os.environ.get(CHROMIUM_ENV) or " or ".join(CHROMIUM_NAMES) + " on PATH"
        return f"no Chromium found ({where}); install it, e.g. `apt-get install chromium`"
    return None


def image_problem(png: bytes) -> str | None:
    """Why a chart's PNG is blank or unreadable, or None when it shows something (pixel variance and ink)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float64)
    except (UnidentifiedImageError, OSError) as err:
        return f"not a readable image ({len(png)} bytes: {err})"
    height, width, _ = pixels.shape
    spread = float(pixels.std(axis=(0, 1)).max())
    flat = pixels.reshape(-1, 3)
    colours, counts = np.unique(flat, axis=0, return_counts=True)
    ink = 1.0 - counts.max() / len(flat)
    if spread < MIN_PIXEL_STD or ink < MIN_INK_SHARE:
        return f"blank: {width}x{height} px, pixel std {spread:.2f}, {ink:.2%} of pixels off the background"
    return None


def data_url_png(src: str) -> bytes:
    """The PNG an <img src="data:image/png;base64,..."> holds (b"" for any other source)."""
    head, _, body = src.partition(",")
    return base64.b64decode(body) if head.startswith("data:image/png;base64") else b""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """Direct children of a process (Linux /proc; empty elsewhere)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def _cmdline(pid: int) -> bytes:
    """A process's command line (Linux /proc), b"" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@dataclass
class LabServer:
    """JupyterLab serving `root` (kernels start there) on 127.0.0.1, from this environment."""

    root: Path
    state: Path  # a scratch folder: Jupyter config, runtime, settings, workspaces, the log
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(24))
    proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.state / "jupyterlab.log"

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}{sep}token={self.token}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def start(self, timeout: float = 120.0) -> LabServer:
        env = dict(os.environ)
        for var, sub in [
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("JUPYTERLAB_SETTINGS_DIR", "settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
            ("IPYTHONDIR", "ipython"),
        ]:
            (self.state / sub).mkdir(parents=True, exist_ok=True)
            env[var] = str(self.state / sub)
        for plugin, values in LAB_SETTINGS.items():
            path = self.state / "settings" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        cmd = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.expose_app_in_browser=True",
            f"--FileCheckpoints.checkpoint_dir={self.state / 'checkpoints'}",  # not notebooks/.ipynb_checkpoints
        ]
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"JupyterLab exited with {self.proc.returncode} before answering; its log ends:\n{self.log_tail()}"
                )
            try:
                if self.api("GET", "api/status") is not None:
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"JupyterLab did not answer on 127.0.0.1:{self.port} within {timeout:.0f} s; "
            f"its log ends:\n{self.log_tail()}"
        )

    def api(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.url(path), method=method)
        if method != "GET":
            req.add_header("Content-Type", "application/json")
            req.data = b"{}"
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else {}

    def kernel_cwds(self) -> set[Path]:
        """The working directories of this server's running kernels (Linux /proc; empty elsewhere)."""
        cwds = set()
        for kid in _children(self.proc.pid) if self.proc else []:
            try:
                cwds.add(Path(os.readlink(f"/proc/{kid}/cwd")))
            except OSError:
                pass
        return cwds

    def shutdown_kernels(self) -> None:
        """Shut every kernel of this server down (between notebooks: frees memory and cores)."""
        for kernel in self.api("GET", "api/kernels"):
            try:
                self.api("DELETE", f"api/kernels/{kernel['id']}")
            except urllib.error.HTTPError:
                pass

    def stop(self) -> None:
        """Kernels first (through the API), then the server by its PID: terminate, wait, kill."""
        if self.proc is None:
            return
        kernels = {kid: _cmdline(kid) for kid in _children(self.proc.pid)}
        if self.proc.poll() is None:
            try:
                self.shutdown_kernels()
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        for kid, cmdline in kernels.items():  # a kernel the server left behind, by its own PID
            if cmdline and _cmdline(kid) == cmdline:  # still that process, not a reused PID
                os.kill(kid, signal.SIGKILL)
        self.proc = None
