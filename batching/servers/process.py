"""A local server as a child process: a free loopback port, a start in a session of its own,
a wait until its OpenAI API answers, and a stop of its whole process group. Shared by
``transformers serve`` (:mod:`.transformers_serve`) and vLLM's server (:mod:`.vllm_serve`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A loopback port no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still running."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the process group ``proc`` leads (a server started with
    ``start_new_session=True``, its workers included), SIGKILL to what is left after 15 s."""
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
        deadline = time.monotonic() + wait_s
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is not None and not group_alive(proc.pid):
            return


def wait_ready(proc: subprocess.Popen[Any], url: str, log: Path, name: str, timeout_s: float) -> float:
    """Seconds until ``url``/models answers 200; raises naming ``name`` (with the last lines of
    ``log``) if the process exits first, or after ``timeout_s``."""
    import httpx

    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"{name} exited with {proc.returncode}: {' | '.join(tail)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{name} did not answer within {timeout_s:g} s (log: {log})")
        time.sleep(0.5)
