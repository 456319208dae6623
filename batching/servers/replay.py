"""Replay a workload against an OpenAI-compatible server with its real arrival times.

Every request is sent at its arrival time to ``POST /v1/completions`` with ``stream: true``
and each streamed chunk is timestamped as it arrives (vLLM, SGLang, TGI and ``transformers
serve`` speak this protocol; :mod:`batching.served` writes the results file).

Exact lengths: ``--prompt ids`` sends token-id prompts with ``max_tokens``, ``ignore_eos``,
``min_tokens`` and ``return_token_ids`` (vLLM >= 0.11.1 then says how many tokens each chunk
carries); ``--prompt text --tokenizer DIR`` sends a text that the server's tokenizer encodes
to exactly the prompt length (vLLM's ``gen_prompt_decode_to_target_len`` loop) and only
``max_tokens``, for servers that refuse unknown fields. Tokens are counted as the server
reports them, as ``vllm bench serve`` counts them: every chunk with choices is one token (its
text may be empty: a held-back partial character, a skipped special token) unless it carries
``token_ids``, and the final ``usage`` is checked against the workload (``usage_mismatch``).

The client's own lateness (send time minus scheduled arrival) is in the summary. Bad input
(an unreachable URL, an unlisted model, a 4xx/5xx, no stream) stops the replay with
:class:`ReplayError`, which keeps what was measured (:attr:`ReplayError.requests`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..validate import colon_pair
from ..workloads import Workload
from .served import ServedRequest, last_line


class ReplayError(ValueError):
    """A replay that cannot go on; ``requests`` holds what was measured so far."""

    def __init__(
        self, msg: str, requests: list[ServedRequest] | None = None, meta: dict[str, Any] | None = None
    ) -> None:
        super().__init__(msg)
        self.requests = requests or []
        self.meta = meta or {}


@dataclass
class ReplayOptions:
    url: str  # base URL ending in /v1
    model: str  # the served model name (as /v1/models lists it)
    prompt: str = "ids"  # "ids" (token-id prompts + ignore_eos/min_tokens) or "text"
    tokenizer: str | None = None  # tokenizer.json or its folder ("text" prompts)
    vocab: tuple[int, int] = (1000, 30000)  # token ids drawn from [lo, hi) ("ids" prompts)
    max_connections: int | None = None  # default: one per request, up to 1024
    timeout_s: float = 600.0  # per request: the longest wait for its next bytes
    seed: int = 0
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request (auth, ...)
    return_token_ids: bool = True  # "ids" prompts: ask for each chunk's token ids (vLLM >= 0.11.1)

    def connections(self, n: int) -> int:
        # Large enough never to hold a request back: the server, not the client, schedules.
        return self.max_connections or max(1, min(n, 1024))


def id_prompts(w: Workload, lo: int, hi: int, seed: int) -> dict[int, list[int]]:
    """Seeded token-id prompts of exactly each request's length."""
    if not (0 <= lo < hi):
        raise ValueError(f"--vocab {lo}:{hi}: expected 0 <= LO < HI")
    rng = np.random.default_rng(seed)
    return {r.rid: rng.integers(lo, hi, size=r.prompt_len).tolist() for r in w.requests}


def load_tokenizer(path: str) -> Any:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` or the folder that holds it."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("--prompt text needs the tokenizers package (pip install tokenizers)") from None
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise FileNotFoundError(f"--tokenizer {path}: no tokenizer.json there")
    return Tokenizer.from_file(str(p))


def _pool(tok: Any) -> np.ndarray:
    """Ids of the ordinary (non-special) tokens: what a prompt is drawn from."""
    special = set(tok.get_added_tokens_decoder())
    return np.array([i for i in range(tok.get_vocab_size()) if i not in special])


def text_prompt(tok: Any, n: int, rng: np.random.Generator, pool: np.ndarray) -> str:
    """A text the tokenizer encodes (special tokens included, as a server's tokenizer call
    does) to exactly ``n`` tokens: draw ids, decode, re-encode, pad or trim, repeat."""
    specials = len(tok.encode("", add_special_tokens=True).ids)
    target = n - specials
    if target < 1:
        raise ValueError(f"prompt_len={n}: the tokenizer adds {specials} special tokens itself")
    ids, tries = rng.choice(pool, size=target).tolist(), 10
    for _ in range(tries):
        text = tok.decode(ids)
        got = tok.encode(text, add_special_tokens=False).ids
        if len(got) == target:
            return text
        ids = got[:target] if len(got) > target else got + rng.choice(pool, size=target - len(got)).tolist()
    raise ValueError(f"prompt_len={n}: no text of exactly that many tokens after {tries} tries")


def text_prompts(w: Workload, tokenizer: str, seed: int) -> dict[int, str]:
    tok = load_tokenizer(tokenizer)
    pool = _pool(tok)
    rng = np.random.default_rng(seed)
    return {r.rid: text_prompt(tok, r.prompt_len, rng, pool) for r in w.requests}


def body(opts: ReplayOptions, prompt: list[int] | str, output_len: int) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": opts.model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.prompt == "ids":  # vLLM / SGLang sampling extras that force the length
        b["ignore_eos"] = True
        b["min_tokens"] = output_len
        if opts.return_token_ids:
            b["return_token_ids"] = True
    return {**b, **opts.extra_body}


def _short(text: str, n: int = 200) -> str:
    """One line of at most ``n`` characters; of a text of several lines (a traceback, an HTML
    page), its last line, where the error is."""
    if len([ln for ln in text.splitlines() if ln.strip()]) > 1:
        return last_line(text, n)
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


class _Fatal(Exception):
    """A server answer that makes the rest of the replay meaningless (4xx/5xx, no stream)."""


async def _one(
    client: Any, opts: ReplayOptions, r: ServedRequest, prompt: Any, clock: Callable[[], float]
) -> None:
    import httpx

    r.sent = clock()
    marker = False  # the last chunk had a finish_reason and nothing else
    try:
        async with client.stream("POST", "/completions", json=body(opts, prompt, r.output_len)) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode(errors="replace")
                r.status, r.error = "error", f"HTTP {resp.status_code}: {_short(text)}"
                raise _Fatal(r.error)
            ctype = resp.headers.get("content-type", "")
            if not ctype.startswith("text/event-stream"):
                r.status = "error"
                r.error = f"the server did not stream (content-type {ctype!r}, expected text/event-stream)"
                raise _Fatal(r.error)
            async for line in resp.aiter_lines():
                now = clock()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    r.status, r.error = "error", f"unreadable stream chunk {_short(data, 80)!r}"
                    return
                if "error" in chunk:
                    r.status, r.error = "error", f"server error in stream: {_short(str(chunk['error']))}"
                    return
                choices = chunk.get("choices")
                if choices:  # one token per chunk with choices, its token_ids where it has them
                    ch = choices[0]
                    ids = ch.get("token_ids")
                    r.add_chunk(now, len(ids) if isinstance(ids, list) else None)
                    marker = ch.get("finish_reason") is not None and not ch.get("text") and ids is None
                usage = chunk.get("usage")
                if usage:
                    r.usage_prompt = usage.get("prompt_tokens")
                    r.usage_output = usage.get("completion_tokens")
    except httpx.TimeoutException:
        r.status, r.error = "timeout", f"no data for {opts.timeout_s:g} s"
        return
    except httpx.HTTPError as e:
        r.status, r.error = "error", f"{type(e).__name__}: {_short(str(e)) or 'connection failed'}"
        return
    if marker and r.usage_output is not None and r.tokens_streamed == r.usage_output + 1:
        # A last chunk with only a finish_reason (transformers serve sends one): no token.
        r.chunk_times.pop()
        r.chunk_tokens.pop()
    if r.usage_output is None:
        r.status, r.error = "usage_mismatch", "the server reported no usage"
    elif (r.usage_prompt, r.usage_output) != (r.prompt_len, r.output_len):
        r.status = "usage_mismatch"
        r.error = (
            f"server counted prompt {r.usage_prompt} / output {r.usage_output} tokens, "
            f"the workload asks {r.prompt_len} / {r.output_len}"
        )
    elif not r.chunk_times:
        r.status, r.error = "error", "the stream carried no token chunk"
    else:
        r.status, r.error = "ok", None


async def check_server(client: Any, url: str, model: str) -> dict[str, Any]:
    """``GET /v1/models``: the server is up and serves ``model``. Returns what it says."""
    import httpx

    try:
        resp = await client.get("/models")
    except httpx.HTTPError as e:
        raise ReplayError(
            f"--url {url}: cannot reach the server ({type(e).__name__}: {_short(str(e))})"
        ) from None
    if resp.status_code >= 400:
        raise ReplayError(f"--url {url}: GET /models answered HTTP {resp.status_code}: {_short(resp.text)}")
    try:
        ids = [m["id"] for m in resp.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ReplayError(f"--url {url}: GET /models did not return an OpenAI model list") from None
    if model not in ids:
        raise ReplayError(f"--served-model {model}: the server lists {', '.join(ids) or 'no models'}")
    return {"models": ids, "server": resp.headers.get("server")}


async def replay_async(
    w: Workload, opts: ReplayOptions, progress: bool = False
) -> tuple[list[ServedRequest], dict[str, Any]]:
    """Replay ``w``; returns the requests as measured and the run's meta (server, client)."""
    import httpx

    if opts.prompt == "ids":
        prompts: dict[int, Any] = id_prompts(w, *opts.vocab, opts.seed)
    elif opts.prompt == "text":
        if not opts.tokenizer:
            raise ValueError("--prompt text needs --tokenizer (the server's tokenizer.json or its folder)")
        prompts = text_prompts(w, opts.tokenizer, opts.seed)
    else:
        raise ValueError(f"--prompt {opts.prompt!r}: expected ids or text")
    reqs = [ServedRequest(r.rid, r.arrival, r.prompt_len, r.output_len) for r in w.requests]
    conns = opts.connections(len(reqs))
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    timeout = httpx.Timeout(opts.timeout_s, connect=min(10.0, opts.timeout_s))
    base = opts.url.rstrip("/")
    async with httpx.AsyncClient(
        base_url=base, limits=limits, timeout=timeout, headers=opts.headers
    ) as client:
        server = await check_server(client, opts.url, opts.model)
        first = reqs[0].arrival
        start = time.perf_counter() + 0.2  # scheduling starts 0.2 s after the prompts are built
        clock = lambda: time.perf_counter() - start + first  # the workload's clock
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(reqs), desc="replay", unit="req")
        inflight = peak = 0

        async def run(r: ServedRequest) -> None:
            nonlocal inflight, peak
            inflight += 1
            peak = max(peak, inflight)
            try:
                await _one(client, opts, r, prompts[r.rid], clock)
            finally:
                inflight -= 1
                if bar is not None:
                    bar.update()

        tasks: list[asyncio.Task[None]] = []
        wall = time.perf_counter()
        fatal: BaseException | None = None
        try:
            for r in reqs:
                delay = r.arrival - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(run(r)))
                done = [t for t in tasks if t.done() and t.exception() is not None]
                if done:
                    fatal = done[0].exception()
                    break
            if fatal is None:
                for fut in asyncio.as_completed(tasks):
                    try:
                        await fut
                    except _Fatal as e:
                        fatal = e
                        break
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if bar is not None:
                bar.close()
        for r in reqs:  # cancelled ones keep what they streamed, marked
            if r.status == "cancelled":
                r.error = "not finished when the replay stopped" if r.sent is not None else "never sent"
        meta = {
            "wall_s": time.perf_counter() - wall,
            "server": {"url": opts.url, "endpoint": "/completions", **server},
            "client": {
                "library": "httpx",
                "httpx": httpx.__version__,
                "max_connections": conns,
                "peak_in_flight": peak,
                "timeout_s": opts.timeout_s,
            },
        }
        if fatal is not None:
            if not isinstance(fatal, _Fatal):
                raise fatal
            bad = next(r for r in reqs if r.error == str(fatal))
            stopped = f"request {bad.rid}: {fatal}"
            meta["stopped"] = stopped
            raise ReplayError(stopped, reqs, meta)
    return reqs, meta


def replay(
    w: Workload, opts: ReplayOptions, progress: bool = False
) -> tuple[list[ServedRequest], dict[str, Any]]:
    """:func:`replay_async` to completion; inside a running event loop (a notebook's kernel)
    it runs on a thread with a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(replay_async(w, opts, progress))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, replay_async(w, opts, progress)).result()


def parse_vocab(text: str) -> tuple[int, int]:
    try:
        return colon_pair(text, int)
    except ValueError:
        raise ValueError(f"--vocab {text!r}: expected LO:HI token ids") from None


def parse_headers(pairs: Sequence[str] | None, api_key: str | None) -> dict[str, str]:
    """``--header NAME:VALUE`` (repeatable) and ``--api-key`` (``Authorization: Bearer``)."""
    out: dict[str, str] = {}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    for text in pairs or []:
        name, sep, value = text.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise ValueError(f"--header {text!r}: expected NAME:VALUE")
        out[name.strip()] = value.strip()
    return out


def parse_extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--extra-body {text!r}: not JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise ValueError(f"--extra-body {text!r}: expected a JSON object")
    return d


__all__: Sequence[str] = ("ReplayError", "ReplayOptions", "replay", "replay_async", "check_server", "body")
