"""Open every page of a built book in headless Chromium and check it works offline.

For each HTML page (folders starting with `_`, the theme's assets, are not pages):
- the page loads over http://127.0.0.1 (a throwaway local server), renders a non-empty
  <title> and a visible <h1>; a meta-refresh page (Jupyter Book's index.html) is followed;
- every <img> has decoded (naturalWidth > 0);
- no console error, uncaught exception or failed/4xx local request;
- NO request leaves the machine: anything but 127.0.0.1/localhost/data:/blob:/about: is
  reported (the machine has no network, so the book must not need one);
- MathJax, when the page loads it, finished typesetting with no error;
- a PNG screenshot goes to the screens folder, for humans.

Chromium is driven through the DevTools protocol over `--remote-debugging-pipe` (fds 3
and 4, NUL-separated JSON): no websocket client, no port, no selenium/playwright.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import functools
import http.server
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The flags the machine notes require: without the background-networking ones Chromium
# keeps trying Google's hosts, which this closed network refuses.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--mute-audio",
    "--window-size=1280,900",
)
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
LOCAL_SCHEMES = {"data", "blob", "about", "chrome-error"}
VIEW_W, VIEW_H, MAX_SHOT_H = 1280, 900, 8000


def find_chromium() -> str | None:
    """$CHROMIUM, else the first Chromium/Chrome on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and (parts.hostname or "") in LOCAL_HOSTS


def pages(html: Path) -> list[Path]:
    """Every built page; `_static`, `_sources`, `_images`... hold assets, not pages."""
    return sorted(
        p
        for p in html.rglob("*.html")
        if not any(part.startswith("_") for part in p.relative_to(html).parts[:-1])
    )


class CDPError(RuntimeError):
    pass


class Browser:
    """Headless Chromium spoken to over --remote-debugging-pipe."""

    def __init__(self, chromium: str, profile: Path) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # Move the child's ends above 10 first, so the dup2 onto 3 and 4 in the child
        # cannot clobber one another whatever numbers os.pipe() returned.
        cr = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        cw = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child_fds() -> None:
            # dup2 clears close-on-exec, so exactly fds 3 and 4 reach Chromium.
            os.dup2(cr, 3)
            os.dup2(cw, 4)

        self.proc = subprocess.Popen(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # close_fds would run after preexec_fn and close 3 and 4 again; Python's own
            # fds are close-on-exec anyway (PEP 446), so nothing else leaks.
            close_fds=False,
            preexec_fn=child_fds,
        )
        os.close(cr)
        os.close(cw)
        self._msgs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._next_id = 0
        self.on_event: Callable[[dict[str, Any]], None] = lambda msg: None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._msgs.put(None)  # Chromium went away
                return
            buf += chunk
            *frames, buf = buf.split(b"\0")
            for frame in frames:
                self._msgs.put(json.loads(frame))

    def pump(self, until: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any] | None:
        """Dispatch messages until one satisfies `until` (returned) or `timeout` passes (None)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self._msgs.get(timeout=left)
            except queue.Empty:
                return None
            if msg is None:
                raise CDPError(f"Chromium exited (code {self.proc.poll()})")
            if "method" in msg:
                self.on_event(msg)
            if until(msg):
                return msg

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self._next_id += 1
        mid = self._next_id
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        reply = self.pump(lambda m: m.get("id") == mid, timeout)
        if reply is None:
            raise CDPError(f"{method}: no reply in {timeout:.0f} s")
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except CDPError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


@dataclass
class PageWatch:
    """What one page did: its requests and its errors."""

    session: str
    inflight: set[str] = field(default_factory=set)
    external: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    loads: int = 0
    last_net: float = field(default_factory=time.monotonic)

    def __call__(self, msg: dict[str, Any]) -> None:
        if msg.get("sessionId") != self.session:
            return
        method, p = msg["method"], msg.get("params", {})
        if method == "Network.requestWillBeSent":
            url = p["request"]["url"]
            if not is_local(url):
                self.external.append(url)
            self.inflight.add(p["requestId"])
            self.last_net = time.monotonic()
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            self.inflight.discard(p["requestId"])
            self.last_net = time.monotonic()
            if method == "Network.loadingFailed" and not p.get("canceled"):
                self.errors.append(f"request failed: {p.get('errorText')} ({p.get('type')})")
        elif method == "Network.responseReceived":
            status = p["response"].get("status", 0)
            # Chromium asks for /favicon.ico by itself when a page names no icon: not the book's.
            if status >= 400 and urlsplit(p["response"]["url"]).path != "/favicon.ico":
                self.errors.append(f"HTTP {status}: {p['response']['url']}")
        elif method == "Page.loadEventFired":
            self.loads += 1
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text")
            self.errors.append(f"uncaught exception: {text}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            self.errors.append(f"console.{p['type']}: {args}")
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            e = p["entry"]
            if urlsplit(e.get("url", "")).path == "/favicon.ico":
                return
            self.errors.append(f"log error: {e.get('text')} {e.get('url', '')}".strip())


# Runs in the page once it has loaded: force images to load, wait for MathJax, report.
INSPECT_JS = """
(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map(i => {
    i.loading = 'eager';
    if (i.complete) return null;
    return new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r);
                               setTimeout(r, 5000); });
  }));
  let mathjax = null;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    mathjax = {typeset: document.querySelectorAll('mjx-container').length,
               errors: document.querySelectorAll('mjx-merror').length};
  }
  // The theme also has an empty/print-only <h1>; the page's own is inside <article>.
  const h1 = document.querySelector('article h1') || document.querySelector('main h1')
             || document.querySelector('h1');
  const r = h1 ? h1.getBoundingClientRect() : null;
  return {
    href: location.href,
    title: document.title,
    h1: h1 ? h1.textContent.replace(/[\\s¶#]+$/u, '').trim() : '',
    h1Visible: !!r && r.width > 0 && r.height > 0,
    imgs: imgs.map(i => ({src: i.currentSrc || i.src, w: i.naturalWidth})),
    mathjax,
    height: Math.ceil(document.documentElement.scrollHeight),
  };
})()
"""


@dataclass
class PageResult:
    page: str
    title: str = ""
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _is_redirect(path: Path) -> bool:
    head = path.read_text(encoding="utf-8", errors="replace")[:2000]
    return re.search(r'http-equiv="refresh"', head, re.I) is not None


def set_viewport(browser: Browser, session: str, height: int) -> None:
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": VIEW_W, "height": height, "deviceScaleFactor": 1, "mobile": False},
        session,
    )


def check_page(
    browser: Browser,
    session: str,
    base: str,
    html: Path,
    page: Path,
    screens: Path | None,
    timeout: float = 20.0,
) -> PageResult:
    rel = page.relative_to(html).as_posix()
    res = PageResult(rel)
    t0 = time.monotonic()
    watch = PageWatch(session)
    browser.on_event = watch
    browser.call("Page.navigate", {"url": f"{base}/{rel}"}, session)
    want_loads = 2 if _is_redirect(page) else 1  # a meta refresh loads a second page
    if browser.pump(lambda m: watch.loads >= want_loads, timeout) is None and watch.loads < want_loads:
        res.problems.append(f"page did not finish loading in {timeout:.0f} s")
    # Let late requests (deferred scripts, MathJax fonts) settle: 0.3 s with nothing in flight.
    settle_end = time.monotonic() + 10
    while time.monotonic() < settle_end and (watch.inflight or time.monotonic() - watch.last_net < 0.3):
        browser.pump(lambda m: False, 0.1)
    info = browser.call(
        "Runtime.evaluate",
        {"expression": INSPECT_JS, "awaitPromise": True, "returnByValue": True},
        session,
        timeout=timeout,
    )
    if "exceptionDetails" in info:
        res.problems.append(f"inspection script failed: {info['exceptionDetails'].get('text')}")
        info_v: dict[str, Any] = {}
    else:
        info_v = info["result"]["value"]
    browser.pump(lambda m: False, 0.2)  # collect what the inspection itself triggered

    res.title = info_v.get("title", "")
    if not res.title.strip():
        res.problems.append("empty <title>")
    if not info_v.get("h1"):
        res.problems.append("no <h1> heading")
    elif not info_v.get("h1Visible"):
        res.problems.append(f"<h1> {info_v['h1']!r} is not visible")
    for img in info_v.get("imgs", []):
        if img["w"] <= 0:
            res.problems.append(f"image not rendered (naturalWidth 0): {img['src']}")
    mj = info_v.get("mathjax")
    if mj and mj["errors"]:
        res.problems.append(f"MathJax: {mj['errors']} formula(s) failed to typeset")
    res.problems += [f"external request: {u}" for u in watch.external]
    res.problems += watch.errors

    if screens is not None and info_v:
        # Whole page: grow the viewport to the page (captureBeyondViewport with a clip
        # mis-places the theme's sticky sidebars), shoot, then restore it.
        height = max(VIEW_H, min(int(info_v.get("height", VIEW_H)), MAX_SHOT_H))
        set_viewport(browser, session, height)
        browser.pump(lambda m: False, 0.3)  # let the re-layout paint
        shot = browser.call("Page.captureScreenshot", {"format": "png"}, session)
        set_viewport(browser, session, VIEW_H)
        name = rel.removesuffix(".html").replace("/", "__") + ".png"
        (screens / name).write_bytes(base64.b64decode(shot["data"]))
    res.seconds = time.monotonic() - t0
    return res


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def check_site(html: Path, screens: Path | None = None, chromium: str | None = None) -> list[PageResult]:
    """Check every page under `html`; returns one result per page (problems empty = fine)."""
    html = html.resolve()
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError(
            "no Chromium found: `make test` installs Debian's chromium; elsewhere set CHROMIUM=/path/to/chrome"
        )
    if screens is not None:
        screens.mkdir(parents=True, exist_ok=True)
        for old in screens.glob("*.png"):
            old.unlink()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(html))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    results: list[PageResult] = []
    with tempfile.TemporaryDirectory(prefix="book-chromium-") as profile:
        browser = Browser(chromium, Path(profile))
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
                "sessionId"
            ]
            for domain in ("Page", "Runtime", "Log", "Network"):
                browser.call(f"{domain}.enable", session=session)
            set_viewport(browser, session, VIEW_H)
            for page in pages(html):
                results.append(check_page(browser, session, base, html, page, screens))
        finally:
            browser.close()
            server.shutdown()
            server.server_close()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path, nargs="?", default=Path("_build/html"))
    ap.add_argument("--screens", type=Path, default=None, help="folder for PNG screenshots")
    args = ap.parse_args(argv)
    results = check_site(args.html, args.screens)
    bad = 0
    for r in results:
        status = "ok" if not r.problems else "FAIL"
        print(f"{status:4} {r.page} ({r.seconds:.1f} s) {r.title!r}")
        for p in r.problems:
            print(f"       {p}")
        bad += bool(r.problems)
    print(f"pages: {len(results) - bad} ok, {bad} with problems")
    return 1 if bad or not results else 0


if __name__ == "__main__":
    sys.exit(main())
