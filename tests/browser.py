"""Headless Chromium driven over the DevTools protocol: open a page from disk, measure it.

`Chromium` starts the Debian `chromium` binary headless with a fresh profile and no
network of its own, finds its DevTools port in the profile's `DevToolsActivePort` file,
and talks to one page target over a websocket (`websocket-client`). `open_page` sets a
viewport (CSS pixels), loads a file and waits for its load event; `evaluate` runs
JavaScript and returns its value; `screenshot` writes a PNG of the viewport.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

from harness.exits import kill_group

#: flags for a headless browser that must not reach any network on its own
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-port=0")
START_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 30.0


class BrowserError(RuntimeError):
    """Chromium did not start, or a DevTools command failed (its message says which)."""


def chromium_path() -> str | None:
    """The `chromium` executable on PATH, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """A headless Chromium with one page; use as a context manager (kills it on exit)."""

    def __init__(self, executable: str) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="esper-chromium-"))
        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self._ids = itertools.count(1)
        self.socket = None
        try:
            self.socket = websocket.create_connection(self._page_socket_url(),
                                                      timeout=LOAD_TIMEOUT_S, suppress_origin=True)
        except BaseException:
            self.close()
            raise

    def _page_socket_url(self) -> str:
        """The websocket URL of the about:blank page, once DevTools answers."""
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrowserError(f"chromium exited with status {self.process.returncode}: "
                                   f"{self.process.stderr.read().decode(errors='replace')[-2000:]}")
            if port_file.is_file() and port_file.read_text().strip():
                port = port_file.read_text().split()[0]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise BrowserError(f"chromium gave no DevTools page within {START_TIMEOUT_S:.0f} s")

    def send(self, method: str, **params) -> dict:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        ident = next(self._ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open_page(self, page: Path, width: int, height: int) -> None:
        """Load `page` from disk in a `width` x `height` viewport and wait for its load event."""
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.send("Page.enable")
        self.send("Page.navigate", url=Path(page).resolve().as_uri())
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())
            if message.get("method") == "Page.loadEventFired":
                return
        raise BrowserError(f"{page}: no load event within {LOAD_TIMEOUT_S:.0f} s")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the viewport (what a reader sees first) written to `path`."""
        data = self.send("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
        kill_group(self.process)  # the browser and its renderer and zygote processes
        self.process.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
