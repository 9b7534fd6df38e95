"""One notebook in JupyterLab's UI, for tests/test_browser.py (the server: tests/browser_support.py).

`NotebookPage` drives one notebook through the UI: Run → Run All Cells, wait until the kernel
is done, read the outcome, move the probe of each explorer.

What the DOM does not say, the notebook model does: JupyterLab 4 renders an exception's
traceback through the stderr renderer (`data-mime-type="application/vnd.jupyter.stderr"`,
the same as a warning), so error outputs are read from the model (`output_type == "error"`)
through `window.jupyterapp` (the server runs with `LabApp.expose_app_in_browser`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from browser_support import EXPLORER, OUTPUT, PROBE, SELECTS, LabServer, data_url_png

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # browser_missing() says so; the test skips before using it
    PlaywrightTimeout = TimeoutError

# Run → Run All Cells in JupyterLab 4 (the menu's own command, then the notebook's).
RUN_ALL = ".lm-Menu-item[data-command='runmenu:run-all'], .lm-Menu-item[data-command='notebook:run-all-cells']"


# --- one notebook in the browser ------------------------------------------------------------

# The notebook panel showing `path`, summarised: kernel status, busy prompts, per code cell its
# execution count, whether it is empty, and its error outputs (ename: evalue).
_STATE_JS = """
(path) => {
  const app = window.jupyterapp;
  if (!app) return {ready: false, why: 'window.jupyterapp is missing (expose_app_in_browser)'};
  let panel = null;
  for (const w of app.shell.widgets('main')) if (w.context && w.context.path === path) panel = w;
  if (!panel || !panel.content || !panel.content.model) return {ready: false, why: 'notebook not open yet'};
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  const prompts = [...panel.node.querySelectorAll('.jp-InputPrompt')].map(e => e.textContent.trim());
  const cells = [];
  const list = panel.content.model.cells;
  for (let i = 0; i < list.length; i++) {
    const cell = list.get(i);
    if (cell.type !== 'code') continue;
    const errors = [];
    for (let j = 0; j < cell.outputs.length; j++) {
      const out = cell.outputs.get(j).toJSON();
      if (out.output_type === 'error') errors.push(`${out.ename}: ${out.evalue}`);
    }
    cells.push({index: i, count: cell.executionCount, empty: !cell.sharedModel.getSource().trim(), errors,
                head: cell.sharedModel.getSource().split('\\n')[0].slice(0, 80)});
  }
  const dialogs = [...document.querySelectorAll('.jp-Dialog')].map(d => d.innerText.slice(0, 300));
  return {ready: true, kernel: kernel ? kernel.status : 'none', busy: prompts.filter(p => p.includes('*')).length,
          cells, dialogs};
}
"""


# Count DOM mutations of an element and remember when the last one happened (page clock).
_WATCH_JS = """
(el) => {
  el.__dsaMutations = 0;
  el.__dsaLast = performance.now();
  if (el.__dsaObserver) el.__dsaObserver.disconnect();
  el.__dsaObserver = new MutationObserver(() => { el.__dsaMutations += 1; el.__dsaLast = performance.now(); });
  el.__dsaObserver.observe(el, {childList: true, subtree: true, attributes: true, characterData: true});
}
"""

# The element is settled: its notebook's kernel idle, its images loaded, no mutation for `quiet` ms.
_SETTLED_JS = """
([el, path, quiet]) => {
  let panel = null;
  for (const w of window.jupyterapp.shell.widgets('main')) if (w.context && w.context.path === path) panel = w;
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  if (!kernel || kernel.status !== 'idle') { el.__dsaLast = performance.now(); return false; }
  if (![...el.querySelectorAll('img')].every(i => i.complete)) return false;
  return performance.now() - el.__dsaLast > quiet;
}
"""


@dataclass
class RunOutcome:
    seconds: float
    cells: list[dict]

    @property
    def errors(self) -> list[str]:
        return [f"cell {c['index']} ({c['head']!r}): {e}" for c in self.cells for e in c["errors"]]

    @property
    def not_run(self) -> list[str]:
        return [f"cell {c['index']} ({c['head']!r})" for c in self.cells if c["count"] is None and not c["empty"]]


class NotebookPage:
    """One JupyterLab tab showing one notebook of `server`."""

    def __init__(self, browser: Any, server: LabServer, name: str, viewport: tuple[int, int] = (1400, 900)):
        self.server, self.name = server, name
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.console_errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text[:300]))
        # ?reset: a fresh workspace, so the tab shows this notebook alone.
        self.page.goto(server.url(f"lab/tree/{name}?reset"), wait_until="domcontentloaded")

    def state(self) -> dict:
        return self.page.evaluate(_STATE_JS, self.name)

    def _wait(self, what: str, done, timeout: float) -> dict:
        deadline, state = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            state = self.state()
            if state.get("ready") and state["kernel"] in ("dead", "autorestarting"):
                raise AssertionError(
                    f"{self.name}: the kernel is {state['kernel']} while {what}; server log:\n{self.server.log_tail()}"
                )
            if state.get("ready") and done(state):
                return state
            time.sleep(0.5)
        raise AssertionError(
            f"{self.name}: timed out after {timeout:.0f} s {what}; last state: "
            f"{json.dumps(state)[:2000]}\nbrowser console errors: {self.console_errors[-5:]}\n"
            f"server log:\n{self.server.log_tail()}"
        )

    def wait_kernel_idle(self, timeout: float = 120.0) -> None:
        self._wait("waiting for the kernel to start", lambda s: s["kernel"] == "idle" and not s["busy"], timeout)

    def run_all(self, timeout: float = 300.0) -> RunOutcome:
        """Run → Run All Cells through the menu bar; wait until every cell ran or one failed."""
        self.wait_kernel_idle()
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^\s*Run\s*$")).first.click()
        self.page.locator(RUN_ALL).first.click()
        start = time.monotonic()

        def finished(s: dict) -> bool:
            ran = all(c["count"] is not None or c["empty"] for c in s["cells"])
            failed = any(c["errors"] for c in s["cells"])  # Run All stops at an error
            return s["kernel"] == "idle" and not s["busy"] and (ran or failed)

        state = self._wait("running all cells", finished, timeout)
        return RunOutcome(time.monotonic() - start, state["cells"])

    @contextmanager
    def stretched(self, max_height: int = 16000) -> Iterator[None]:
        """The viewport stretched to the whole notebook (nothing scrolls inside the page, so a page
        screenshot shows every cell and an explorer's screenshot is one piece), then restored:
        a tall page costs Chromium a lot of painting while cells run."""
        size = dict(self.page.viewport_size)
        extra = self.page.evaluate(
            """() => {
              const outer = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer')
                         || document.querySelector('.jp-NotebookPanel-notebook');
              return outer ? outer.scrollHeight - outer.clientHeight : 0;
            }"""
        )
        if extra > 0:
            self.page.set_viewport_size(
                {"width": size["width"], "height": min(size["height"] + extra + 40, max_height)}
            )
        try:
            self.page.evaluate(  # Run All left the last cell scrolled into view: back to the top
                "() => document.querySelectorAll('.jp-NotebookPanel .jp-WindowedPanel-outer')"
                ".forEach(e => { e.scrollTop = 0; })"
            )
            self.wait_images_painted()
            yield
        finally:
            self.page.set_viewport_size(size)

    def wait_images_painted(self, timeout: float = 30.0) -> None:
        """Every image of the notebook loaded and decoded, and two frames painted since."""
        self.page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-NotebookPanel img')].every(i => i.complete)",
            timeout=timeout * 1000,
        )
        self.page.evaluate(
            """async () => {
              await Promise.all([...document.querySelectorAll('.jp-NotebookPanel img')]
                                .map(i => i.decode().catch(() => null)));
              await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
            }"""
        )

    def screenshot_notebook(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.stretched():
            self.page.screenshot(path=str(path))

    def screenshot_explorer(self, explorer: Any, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.stretched():
            explorer.screenshot(path=str(path))

    def explorers(self) -> list:
        return self.page.locator(EXPLORER).all()

    def move_probe(
        self, explorer: Any, timeout: float = 120.0, quiet: float = 1.5, images: int | None = None
    ) -> tuple[str, str]:
        """Move the explorer's probe (`move_select`)."""
        return self.move_select(explorer, explorer.locator(PROBE).first, timeout, quiet, images)

    def selects(self, explorer: Any) -> list[Any]:
        """The explorer's Dropdowns a user can move now: enabled, with another option to pick."""
        found = explorer.locator(SELECTS)
        chosen = []
        for i in range(found.count()):
            select = found.nth(i)
            if select.is_enabled() and select.locator("option").count() > 1:
                chosen.append(select)
        return chosen

    def images(self, explorer: Any) -> list[bytes]:
        """The PNG of every chart the explorer shows (JupyterLab renders image/png as a data URL)."""
        return [data_url_png(src or "") for src in explorer.locator("img").evaluate_all("els => els.map(e => e.src)")]

    def move_select(
        self,
        explorer: Any,
        select: Any,
        timeout: float = 120.0,
        quiet: float = 1.5,
        images: int | None = None,
        to: int | None = None,
    ) -> tuple[str, str]:
        """Select another option of one of the explorer's Dropdowns (the next, or the one at index `to`); wait until
        its output changed and settled.

        Settled: the kernel is idle, every image in the output is decoded, and the output's DOM
        has not changed for `quiet` seconds of the page's own clock (an ipywidgets Output receives
        its outputs as widget state, which the page may apply after the kernel went idle); with
        `images`, also until the explorer holds that many images again (a busy machine can take
        longer than `quiet` between clearing the output and drawing into it; the caller asserts
        the count, so a redraw that never comes still fails there).
        Returns (old option, new option)."""
        output = explorer.locator(OUTPUT).first
        options = select.locator("option").all_inner_texts()
        if len(options) < 2:
            raise AssertionError(f"{self.name}: the explorer's control offers {options!r}; it needs two options")
        old_index = select.evaluate("s => s.selectedIndex")
        new_index = (old_index + 1) % len(options) if to is None else to
        moved = f"moving a control from {options[old_index]!r} to {options[new_index]!r}"
        before = output.inner_html()
        output.evaluate(_WATCH_JS)
        select.select_option(index=new_index)
        try:
            self.page.wait_for_function(
                "el => el.__dsaMutations > 0", arg=output.element_handle(), timeout=timeout * 1000, polling=100
            )
        except PlaywrightTimeout:
            raise AssertionError(
                f"{self.name}: {moved} did not change the explorer's output within {timeout:.0f} s"
            ) from None
        try:
            self.page.wait_for_function(
                _SETTLED_JS, arg=[output.element_handle(), self.name, quiet * 1000], timeout=timeout * 1000, polling=250
            )
        except PlaywrightTimeout:
            raise AssertionError(
                f"{self.name}: after {moved}, the explorer's output did not settle "
                f"(kernel idle, {quiet} s without change) within {timeout:.0f} s"
            ) from None
        if images is not None:
            try:
                self.page.wait_for_function(
                    "([el, n]) => el.querySelectorAll('img').length === n",
                    arg=[explorer.element_handle(), images],
                    timeout=timeout * 1000,
                    polling=250,
                )
            except PlaywrightTimeout:
                pass  # the caller's count assertion says what is there
        if output.inner_html() == before:
            raise AssertionError(f"{self.name}: {moved} redrew the explorer's output, but it shows the same as before")
        self.wait_images_painted()
        return options[old_index], options[new_index]

    def close(self) -> None:
        self.page.close()
