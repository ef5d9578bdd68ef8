"""Headless Debian chromium driven through its DevTools protocol (a websocket), offline: the
view's and the report's pages checked as a reader's browser draws them.

Screenshots go under ``$TVM_PROBE_ARTIFACTS`` (default ``build/test-artifacts/``).  Tests that
need the browser mark themselves with :data:`needs_chromium`: they skip, saying why, only where
chromium is missing.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                    "(apt-get install chromium; .ci/run does)")
ARTIFACTS = Path(os.environ.get("TVM_PROBE_ARTIFACTS", Path(__file__).parents[2] / "build" / "test-artifacts"))


class Chromium:
    """Headless Debian chromium driven through the DevTools protocol (one page)."""

    def __init__(self, url: str, size=(1400, 900)):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="tvm_probe_chromium_")
        port = free_port()
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={self.profile}", f"--remote-debugging-port={port}",
             f"--window-size={size[0]},{size[1]}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        page = wait(lambda: next((p for p in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
                                  if p["type"] == "page"), None), 30, "chromium's DevTools endpoint")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], suppress_origin=True, timeout=60)
        self.n = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, *patterns: str, timeout: float = 60) -> str:
        """The page's text once it has loaded whole and every regular expression (case-insensitive)
        matches in it: the parser shows a long page's top (a heading the patterns find) before it
        has read the tables at its end, and the page keeps rendering after it loads, so a single
        reading could come too early."""
        def ready():
            text = self.evaluate("document.readyState === 'complete' && document.body ? document.body.innerText : ''")
            text = text or ""
            return text if all(re.search(p, text, re.IGNORECASE) for p in patterns) else None
        return wait(ready, timeout, f"the page to show {patterns}")

    def screenshot(self, name: str, full_page: bool = False) -> Path:
        """A PNG of the viewport (or of the whole page) saved as ``ARTIFACTS/name``."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        params = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))
        return path

    def close(self):
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(probe, timeout: float, what: str):
    """``probe()``'s first true answer, polled until ``timeout`` seconds (OSError: not yet)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            got = probe()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])
