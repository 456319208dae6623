"""The server subcommands of ``python -m batching``: ``replay``, ``export``, ``import-vllm``,
with ``simulate``'s workload and output options and table."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .. import results
from ..servers import served
from ..validate import number
from ..workloads import Workload
from . import options

NO_CONTEXT_LIMIT = 10**9  # the server enforces its own context (a too-long row is a 4xx)


def _workload(a: argparse.Namespace) -> Workload:
    return options.load_workload(a, a.max_context or NO_CONTEXT_LIMIT)


def _write(a: argparse.Namespace, doc: dict[str, Any]) -> None:
    options.write_outputs(a, doc)
    for line in served.problems(doc):
        print(line, file=sys.stderr)


def cmd_replay(a: argparse.Namespace) -> int:
    from ..servers.replay import (
        ReplayError,
        ReplayOptions,
        parse_extra_body,
        parse_headers,
        parse_vocab,
        replay,
    )

    slo = options.parse_slo(a)
    w = _workload(a)
    opts = ReplayOptions(
        url=a.url,
        model=a.served_model,
        prompt=a.prompt,
        tokenizer=a.tokenizer,
        vocab=parse_vocab(a.vocab),
        max_connections=a.max_connections,
        timeout_s=number("--request-timeout", a.request_timeout, above=True, error=ValueError),
        seed=a.seed,
        extra_body=parse_extra_body(a.extra_body),
        headers=parse_headers(a.header, a.api_key or os.environ.get("OPENAI_API_KEY")),
        return_token_ids=not a.no_token_ids,
    )
    if opts.max_connections is not None and opts.max_connections < 1:
        raise ValueError(f"--max-connections={opts.max_connections}: must be >= 1")
    config = {
        "command": "replay",
        **options.workload_config(a, w),
        "model": a.served_model,
        "device": "server",
        "url": a.url,
        "prompt": a.prompt,
        "tokenizer": a.tokenizer,
        "vocab": a.vocab,
        "extra_body": opts.extra_body,
        "return_token_ids": opts.prompt == "ids" and opts.return_token_ids,
        "headers": sorted(opts.headers),  # names only: values may be secrets
        "scheduler": {"scheduler": "server", "note": "the server's own; see its launch flags"},
        "executor": {"executor": "remote", "endpoint": f"{a.url.rstrip('/')}/completions"},
    }
    failure: ReplayError | None = None
    try:
        reqs, meta = replay(w, opts, progress=options.progress(a))
    except ReplayError as e:
        if not e.requests:
            raise
        failure, reqs, meta = e, e.requests, e.meta
    client = meta.get("client", {})
    config["max_connections"] = client.get("max_connections", opts.connections(len(w)))
    if client and client["peak_in_flight"] > client["max_connections"]:
        # Requests past the limit waited in the client's pool: the client, not the server, queued them.
        print(
            f"warning: {client['peak_in_flight']} requests in flight on {client['max_connections']} connections; "
            "later requests waited in the client (raise --max-connections)",
            file=sys.stderr,
        )
    doc = served.build(reqs, config, meta, slo=slo)
    _write(a, doc)
    if failure is not None:
        print(f"error: {failure} (measured so far kept{' in ' + a.out if a.out else ''})", file=sys.stderr)
        return 2
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from ..servers.vllm_io import export_custom, export_timed_trace, require_jsonl

    require_jsonl(a.out, a.format)  # before the workload loads: one line, nothing written
    if a.format == "vllm-timed-trace":
        if a.tokenizer:
            raise ValueError("--tokenizer: vllm-timed-trace has no prompts (vLLM builds them from hash_ids)")
        if a.block_size < 1:
            raise ValueError(f"--block-size={a.block_size}: must be >= 1")
        w = _workload(a)
        info = export_timed_trace(w, a.out, block_size=a.block_size)
        print(f"wrote {info['path']} ({info['requests']} requests over {info['span_s']:.4g} s)")
        print(
            "arrivals: the trace's own timestamps, which vllm bench serve (>= 0.23.0) sends at "
            f"with --self-timed; hash_ids per {a.block_size}-token block, none shared"
        )
    else:
        w = _workload(a)
        info = export_custom(w, a.out, tokenizer=a.tokenizer, seed=a.seed)
        fit = info["arrival_fit"]
        print(f"wrote {info['path']} ({info['requests']} requests)")
        print(
            f"arrivals: rate {fit['rate']:.4g} req/s, Gamma burstiness {fit['burstiness']:.3g} by moments "
            f"({fit['burstiness_mle']:.3g} by maximum likelihood) over {fit['gaps']} gaps"
            if fit["rate"] is not None and fit["burstiness_mle"] is not None
            else f"arrivals: too few distinct gaps to fit ({fit['gaps']} gaps)"
        )
    print("vllm bench serve " + " ".join(info["vllm_bench_flags"]))
    if a.format == "vllm-timed-trace":
        print("then: python -m batching import-vllm RESULT.json (these workload options) --self-timed")
    if a.info:
        results.write_json(info, a.info)
        print(f"wrote {a.info}")
    return 0


def cmd_import_vllm(a: argparse.Namespace) -> int:
    from ..servers.vllm_io import import_result, read_result

    if a.run is not None and a.run < 1:
        raise ValueError(f"--run={a.run}: must be >= 1 (1 = the first result in the file)")
    if a.self_timed and not (a.trace or a.preset):
        raise ValueError("--self-timed: give the exported workload's options (its arrivals are the schedule)")
    doc_in = read_result(a.result, run=a.run)
    w = _workload(a) if (a.trace or a.preset) else None
    reqs, params, duration, arrivals = import_result(doc_in, w, self_timed=a.self_timed)
    slo = options.parse_slo(a)
    name = w.name if w is not None else Path(a.result).stem
    config = {
        "command": "import-vllm",
        "workload": {"name": name, "info": w.info if w is not None else {}, "requests": len(reqs)},
        "model": params.get("model_id"),
        "device": "server",
        "url": None,
        "source": str(a.result),
        "run": a.run,
        "self_timed": a.self_timed,
        "vllm": params,
        "arrivals": arrivals,
        "scheduler": {"scheduler": "vllm", "note": "vllm serve's own; see its launch flags"},
        "executor": {"executor": "remote", "backend": params.get("backend")},
    }
    meta = {"wall_s": duration or 0.0, "server": {"vllm_date": params.get("date")}}
    doc = served.build(reqs, config, meta, slo=slo, duration_s=duration)
    _write(a, doc)
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``replay``, ``export`` and ``import-vllm`` on ``sub``."""
    r = sub.add_parser("replay", help="replay a workload against an OpenAI-compatible server")
    options.add_workload_args(r)
    g = r.add_argument_group("server")
    g.add_argument("--url", required=True, help="base URL of the OpenAI API, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--served-model", required=True, help="model name as the server's /v1/models lists it")
    g.add_argument(
        "--prompt",
        choices=["ids", "text"],
        default="ids",
        help="ids: token-id prompts with ignore_eos/min_tokens (vLLM, SGLang); "
        "text: text of exact length from --tokenizer, max_tokens only (transformers serve)",
    )
    g.add_argument("--tokenizer", help="the server's tokenizer.json or its folder (--prompt text)")
    g.add_argument("--vocab", default="1000:30000", help="token ids of --prompt ids prompts, LO:HI")
    g.add_argument("--max-connections", type=int, help="HTTP connection limit (default: one per request)")
    g.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds a request may wait for its next bytes"
    )
    g.add_argument("--extra-body", help="JSON object merged into every request body")
    g.add_argument(
        "--api-key",
        help="sent as Authorization: Bearer KEY (default: $OPENAI_API_KEY, as vLLM's client does)",
    )
    g.add_argument(
        "--header",
        action="append",
        metavar="NAME:VALUE",
        help="an HTTP header for every request (repeatable)",
    )
    g.add_argument(
        "--no-token-ids",
        action="store_true",
        help="--prompt ids: do not ask for return_token_ids (vLLM >= 0.11.1 streams each chunk's token ids)",
    )
    g.add_argument("--max-context", type=int, help="refuse (or --cap) requests longer than this")
    options.add_output_args(r)
    r.set_defaults(func=cmd_replay)

    e = sub.add_parser("export", help="write a workload for another benchmark (vllm bench serve)")
    options.add_workload_args(e)
    e.add_argument(
        "--format",
        choices=["vllm-timed-trace", "vllm-custom"],
        required=True,
        help="vllm-timed-trace: --dataset-name timed_trace, sent at the trace's timestamps (vLLM >= 0.23.0); "
        "vllm-custom: --dataset-name custom, Gamma arrivals fitted to the trace",
    )
    e.add_argument("--out", required=True, help="the .jsonl to write")
    e.add_argument("--tokenizer", help="vllm-custom: served model's tokenizer.json, prompts of exact length")
    e.add_argument(
        "--block-size", type=int, default=16, help="vllm-timed-trace: prompt tokens per hash id (default 16)"
    )
    e.add_argument("--info", help="also write the arrival fit and vLLM flags as JSON")
    e.add_argument("--max-context", type=int)
    e.set_defaults(func=cmd_export)

    i = sub.add_parser(
        "import-vllm", help="turn a vllm bench serve --save-detailed result into a results file"
    )
    i.add_argument("result", help="the JSON vllm bench serve --save-result --save-detailed wrote")
    options.add_workload_args(i)
    # The workload is optional here: given, it checks vLLM's lengths and supplies the rids.
    for grp in i._mutually_exclusive_groups:
        grp.required = False
    i.add_argument("--max-context", type=int)
    i.add_argument(
        "--run", type=int, help="which result of a file written with --append-result (1 = the first)"
    )
    i.add_argument(
        "--self-timed",
        action="store_true",
        help="the run was --dataset-name timed_trace --self-timed on this workload's export: arrivals at "
        "its timestamps, so dispatch lateness is vLLM's own (its file does not record the flag)",
    )
    options.add_output_args(i)
    i.set_defaults(func=cmd_import_vllm)
