"""Sphinx extension (loaded through `_config.yml`'s `local_extensions`): keep the book offline.

Jupyter Book 1 always loads sphinx-thebe. Thebe is never used here (no launch buttons, no
Binder), yet every page gets its inline config naming a CDN URL, and with Sphinx 7.4 that
inline script is added twice, which throws "Identifier 'THEBE_JS_URL' has already been
declared" in the browser. This drops sphinx-thebe's scripts from every page.
"""

from __future__ import annotations

from typing import Any


def _is_thebe(script: Any) -> bool:
    name = str(getattr(script, "filename", script) or "")
    body = str(getattr(script, "attributes", {}).get("body", ""))
    return name.endswith("sphinx-thebe.js") or "THEBE_JS_URL" in body


def _drop_thebe(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    scripts = context.get("script_files")
    if scripts:
        context["script_files"] = [s for s in scripts if not _is_thebe(s)]


def setup(app: Any) -> dict[str, Any]:
    # After every other listener, so nothing re-adds the scripts.
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
