"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol: open a page (with
extra request headers, e.g. a bearer token: never on a command line), read the browser's own
navigation timing, ask where elements are drawn, take a screenshot."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect


class Chromium:
    def __init__(self, profile: Path, width: int = 1280, height: int = 900):
        self.profile, self.width, self.height = Path(profile), width, height
        self.proc: subprocess.Popen | None = None
        self.ws = None
        self._stack = contextlib.ExitStack()
        self._id = 0
        self.events: list[dict] = []

    def __enter__(self) -> "Chromium":
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if browser is None:
            raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
        self.profile.mkdir(parents=True, exist_ok=True)
        port_file = self.profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={self.profile}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._connect(port_file)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _connect(self, port_file: Path) -> None:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        while True:  # the first tab appears shortly after the port
            targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
            pages = [t for t in targets if t["type"] == "page"]
            if pages:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("chromium opened no page")
            time.sleep(0.1)
        self.ws = self._stack.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 2 ** 20,
                                                    open_timeout=30))
        self.send("Page.enable")
        self.send("Network.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1,
                  mobile=False)

    def __exit__(self, *exc) -> None:
        self._stack.close()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def send(self, method: str, timeout: float = 120, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def _wait_event(self, method: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic()))))

    def open(self, url: str, headers: dict | None = None) -> dict:
        """Load ``url`` and return the browser's navigation timing of it (milliseconds from the
        navigation's start: ``responseStart``, ``domContentLoaded``, ``load``) and its HTTP status."""
        self.send("Network.setExtraHTTPHeaders", headers=headers or {})
        self.events.clear()
        self.send("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired")
        return self.evaluate(
            "(() => { const n = performance.getEntriesByType('navigation')[0];"
            " return {responseStart: n.responseStart, domContentLoaded: n.domContentLoadedEventEnd,"
            " load: n.loadEventEnd || performance.now(), status: n.responseStatus, bytes: n.transferSize}; })()")

    def wait_for(self, expression: str, timeout: float = 60):
        """``expression``'s value once it is truthy (a page a script renders after its load event)."""
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} still {value!r} after {timeout:.0f} s")
            time.sleep(0.2)
        return value

    def set_cookie(self, url: str, name: str, value: str) -> None:
        """A cookie for ``url``'s site as a server sets a session's (HttpOnly, SameSite=Lax)."""
        self.send("Network.setCookie", url=url, name=name, value=value, httpOnly=True, sameSite="Lax")

    def side_by_side(self, pngs: list[Path], out: Path) -> Path:
        """Screenshots next to each other in one PNG (drawn by the browser itself: no image library)."""
        images = "".join(f"<img src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}'"
                         " style='display:block;margin-right:8px'>" for p in pngs)
        self.send("Page.navigate", url="about:blank")
        self.evaluate(f"document.body.style.cssText = 'margin:0;display:flex;background:#888;width:max-content';"
                      f"document.body.innerHTML = {json.dumps(images)};"
                      "Promise.all([...document.images].map(i => i.decode()))")
        self.wait_for("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
        return self.screenshot(out, full_page=True)

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, png: Path, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params |= {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": size[0], "height": min(size[1], 16_000), "scale": 1}}
        png.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]))
        return png
