"""A tiny OpenAI-compatible server on 127.0.0.1 for the replay tests (``http.server``, a thread).

``POST /v1/completions`` streams one SSE chunk per output token, ``token_delay_s`` apart,
then a usage chunk and ``[DONE]``, as vLLM does with ``stream_options.include_usage``.
``mode`` makes it misbehave the way real servers do: ``short`` (one token fewer than
asked, reported so in usage), ``status:<code>`` (answer HTTP <code> when the prompt has
``bad_prompt_len`` tokens, else normal), ``json`` (no streaming), ``bundle`` (two tokens per
chunk), ``empty_text`` (every other chunk's text empty, as vLLM streams a held-back partial
character or a skipped special token), ``finish_chunk`` (a last chunk holding only
``finish_reason`` and the usage, as ``transformers serve`` ends its stream), ``no_usage``. A request asking ``return_token_ids``
gets each chunk's ``token_ids``. With ``api_key``, a request without ``Authorization: Bearer
<api_key>`` is answered 401, as ``vllm serve --api-key`` does.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeOpenAI:
    def __init__(
        self, mode: str = "ok", model: str = "fake", token_delay_s: float = 0.002, api_key: str | None = None
    ) -> None:
        self.mode, self.model, self.token_delay_s, self.api_key = mode, model, token_delay_s, api_key
        self.headers: list[dict[str, str]] = []  # every request's headers
        self.bad_prompt_len: int | None = None
        self.received: list[tuple[float, dict[str, Any]]] = []  # (perf_counter, body)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest's output clean
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                owner.headers.append(dict(self.headers.items()))
                if owner.api_key is None or self.headers.get("Authorization") == f"Bearer {owner.api_key}":
                    return True
                self._send(401, b'{"error": "Unauthorized"}')
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": owner.model}]}).encode())
                else:
                    self._send(404, b'{"detail": "not found"}')

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                if not self._authorized():
                    return
                owner.received.append((time.perf_counter(), body))
                try:
                    owner.respond(self, body)
                except (BrokenPipeError, ConnectionResetError):  # the client stopped listening
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def respond(self, h: Any, body: dict[str, Any]) -> None:
        prompt = body["prompt"]
        p = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        out = int(body["max_tokens"])
        mode = self.mode
        if body.get("model") != self.model:
            h._send(404, json.dumps({"error": f"model {body.get('model')!r} not found"}).encode())
            return
        if mode.startswith("status:") and p == self.bad_prompt_len:
            h._send(int(mode.split(":")[1]), b'{"error": {"message": "prompt rejected"}}')
            return
        if mode == "json":
            h._send(200, json.dumps({"choices": [{"text": "x " * out}], "usage": {}}).encode())
            return
        if mode == "short":
            out -= 1
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        per = 2 if mode == "bundle" else 1
        sent = 0
        while sent < out:
            k = min(per, out - sent)
            time.sleep(self.token_delay_s)
            text = "" if mode == "empty_text" and sent % 2 == 1 else " tok" * k
            choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = list(range(sent, sent + k))
            chunk = {"choices": [choice]}
            h.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            h.wfile.flush()
            sent += k
        usage = {"prompt_tokens": p, "completion_tokens": out, "total_tokens": p + out}
        if mode == "finish_chunk":
            last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
            h.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
        elif mode != "no_usage":
            h.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()
        h.close_connection = True
