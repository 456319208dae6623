"""Derive data/profiles/gpu/*.json (step-cost profiles of A100 and H100 GPUs) from Vidur's
published operator profiles.

Vidur (github.com/microsoft/vidur, MIT licence) measured every linear and element-wise
operator of one transformer layer on real GPUs, for 1 to 4,096 tokens per step (the A100
Llama 3 tables to 32,768) at tensor parallel 1, 2, 4 and 8 (``mlp.csv``), and all-reduces
on 8-GPU NVLink nodes (``all_reduce.csv``). A profile here is a
:class:`batching.costs.ProfileCost` file (schema 1) whose steps are

* **measured** (Vidur's medians): the linear and element-wise parts, the nine per-layer
  operators x layers + the embedding lookup once, at each measured token count (rows of a
  repeated token count averaged); for tp > 1 the two all-reduces of each layer, message =
  step tokens x d_model x 2 bytes (fp16), interpolated in size over the node's table;
* **modelled**: the KV read and write and the LM head at the bandwidth the same GPU's
  batch-1 linear layers achieved (their weight bytes / the measured 1-token linear time),
  the head's FLOPs and the prefill attention's FLOPs at the datasheet peak (the roofline's
  terms), and the roofline's per-step overhead (``DeviceSpec.step_overhead_s``).

``prefill_rows`` and ``mixed`` are points of the same model (equal prompts side by side, a
chunk beside decodes), so that ``ProfileCost`` prices a step's attention pairs and a mixed
step's linear layers on its total tokens; ``parts`` keeps the measured curves for the book.
Every file read is checked against ``SHA256SUMS`` first: a missing or altered file is refused
in one line (exit 2). Run from the repository root:

    .venv/bin/python benchmarks/derive_gpu_profiles.py [--source DIR] [--out DIR]

``--source`` defaults to the shipped copies, ``data/gpu-profiles/vidur`` (gzip-compressed;
the plain files of ``../shared/gpu-profiles/vidur`` give the same profiles).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batching.costs import get_device, get_model  # noqa: E402
from batching.costs.models import ModelShape  # noqa: E402

SOURCE = ROOT / "data" / "gpu-profiles" / "vidur"
OUT = ROOT / "data" / "profiles" / "gpu"
REPO = "github.com/microsoft/vidur"
COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
COMMIT_DATE = "2024-11-19"
LICENCE = "MIT (Copyright (c) Microsoft Corporation); text in data/gpu-profiles/vidur/LICENSE"
CITATION = 'Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024'

#: The nine per-layer operators of mlp.csv (everything but ``emb``, which runs once a step).
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
#: Vidur's directories per GPU: compute tables and the 8-GPU NVLink node's all-reduces.
GPUS = {
    "h100": {"device": "h100", "network": "network/h100_dgx/all_reduce.csv", "name": "NVIDIA H100"},
    "a100": {"device": "a100", "network": "network/a100_dgx/all_reduce.csv", "name": "NVIDIA A100"},
}
#: (GPU, Vidur's model directory, registry model, tensor-parallel degrees derived).
PROFILES: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    ("h100", "meta-llama/Llama-2-7b-hf", "llama-2-7b", (1, 2)),
    ("h100", "meta-llama/Llama-2-70b-hf", "llama-2-70b", (2, 4)),
    ("h100", "codellama/CodeLlama-34b-Instruct-hf", "codellama-34b", (1, 2)),
    ("a100", "meta-llama/Meta-Llama-3-8B", "llama-8b", (1,)),
    ("a100", "meta-llama/Meta-Llama-3-70B", "llama-70b", (2,)),
)
#: The decode grid's contexts below the model's own limit (the step is linear in context, so
#: bilinear interpolation between these is exact); its batches are Vidur's token counts up
#: to 512 (every 8: the linear layers' cost moves in tile-sized steps) and every 64 to 1,024.
DECODE_CTX = (16, 512, 2048)
DECODE_MAX = 1024
#: Mixed steps: chunk tokens x decode rows at one context; prefill_rows: (rows, tokens) whose
#: totals are prefill grid points (ProfileCost fits attention per pair from them).
MIXED_CHUNKS = (64, 128, 256, 512, 1024, 2048)
MIXED_ROWS = (1, 8, 32, 64, 128, 256)
MIXED_CTX = 1024
PREFILL_ROWS = ((2, 512), (8, 128), (4, 512), (16, 128))
#: fp16 activations: the bytes of one token's hidden state per d_model element.
ACT_BYTES = 2


class SourceError(Exception):
    """A source file missing, or not the one SHA256SUMS names."""


def compute_path(gpu: str, model_dir: str) -> str:
    return f"compute/{gpu}/{model_dir}/mlp.csv"


def _sums(source: Path) -> dict[str, str]:
    path = source / "SHA256SUMS"
    if not path.is_file():
        raise SourceError(f"{path}: missing (the sha256 of every source file)")
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.removeprefix("./")] = digest
    return out


def read_source(source: Path, rel: str, sums: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The text of ``rel`` (the plain file or its ``.gz``) after its sha256 matched SHA256SUMS,
    and its provenance record."""
    plain, gz = source / rel, source / (rel + ".gz")
    if plain.is_file():
        data = plain.read_bytes()
    elif gz.is_file():
        try:
            data = gzip.decompress(gz.read_bytes())
        except (OSError, EOFError) as e:
            raise SourceError(f"{gz}: not a readable gzip file ({e})") from None
    else:
        raise SourceError(f"{plain}: missing (nor {gz.name})")
    if rel not in sums:
        raise SourceError(f"{plain}: not listed in {source / 'SHA256SUMS'}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sums[rel]:
        raise SourceError(f"{plain}: sha256 {digest} is not {sums[rel]} (SHA256SUMS): altered")
    return data.decode(), {"path": rel, "sha256": digest}


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def linear_curve(rows: list[dict[str, str]], layers: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """Token counts and the measured linear + element-wise ms of a whole step at ``tp``: the
    nine per-layer medians x ``layers`` + ``emb`` once (rows of one token count averaged)."""
    by: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if int(r["num_tensor_parallel_workers"]) != tp:
            continue
        per_layer = sum(float(r[f"time_stats.{op}.median"]) for op in LAYER_OPS)
        by[int(r["num_tokens"])].append(layers * per_layer + float(r["time_stats.emb.median"]))
    if not by:
        raise SourceError(f"no rows at num_tensor_parallel_workers={tp}")
    tokens = np.array(sorted(by), dtype=np.float64)
    return tokens, np.array([float(np.mean(by[int(t)])) for t in tokens])


def allreduce_table(rows: list[dict[str, str]], tp: int) -> tuple[np.ndarray, np.ndarray]:
    """Message bytes and median ms of one all-reduce over ``tp`` GPUs of one node (rows with
    devices_per_node = num_workers; repeated sizes averaged)."""
    by: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if int(r["num_workers"]) == tp and int(r["devices_per_node"]) == tp:
            by[int(r["size"])].append(float(r["time_stats.all_reduce.median"]))
    if not by:
        raise SourceError(f"no all-reduce rows for {tp} workers on one node")
    size = np.array(sorted(by), dtype=np.float64)
    return size, np.array([float(np.mean(by[int(s)])) for s in size])


def allreduce_ms(size: np.ndarray, ms: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """One all-reduce of ``nbytes``: linear between measured sizes, the smallest's time below
    them, and beyond the largest its time scaled by the bytes (bandwidth-bound there)."""
    inside = np.interp(nbytes, size, ms)
    return np.where(nbytes > size[-1], ms[-1] * nbytes / size[-1], inside)


class Derived:
    """One (GPU, model, tp)'s step model: measured curves, modelled terms, in ms."""

    def __init__(
        self,
        gpu: str,
        model_dir: str,
        shape: ModelShape,
        tp: int,
        mlp: list[dict[str, str]],
        net: list[dict[str, str]] | None,
    ) -> None:
        if shape.heads % tp or shape.kv_heads % tp:
            raise SourceError(f"tp={tp} does not divide {shape.name}'s heads")
        self.gpu, self.model_dir, self.shape, self.tp = gpu, model_dir, shape, tp
        self.device = get_device(GPUS[gpu]["device"])
        self._check_shape(mlp[0])
        self.vocab_csv = int(mlp[0]["vocab_size"])  # Vidur's, seen by its embedding lookup only
        self.tokens, self.linear = linear_curve(mlp, shape.layers, tp)
        self.ar = allreduce_table(net, tp) if tp > 1 and net is not None else None
        m = shape
        # The weights the nine operators stream per GPU (projections; norms are negligible).
        self.linear_weight_bytes = m.layers * m.layer_matmul_params * m.bytes_per_param / tp
        self.bw = self.linear_weight_bytes / (self.linear_1() / 1e3)  # bytes/s, achieved
        self.kv_token_bytes = m.kv_bytes_per_token / tp
        self.head_bytes = m.vocab * m.hidden * m.bytes_per_param / tp
        self.peak = self.device.peak(m.dtype)
        self.overhead_ms = self.device.step_overhead_s * 1e3

    def _check_shape(self, row: dict[str, str]) -> None:
        m = self.shape
        want = {"n_head": m.heads, "n_kv_head": m.kv_heads, "n_embd": m.hidden, "n_expanded_embd": m.ffn}
        got = {k: int(row[k]) for k in want}
        if got != want:
            raise SourceError(f"{self.model_dir}: CSV shape {got} is not {m.name}'s {want}")

    def linear_1(self) -> float:
        return float(np.interp(1.0, self.tokens, self.linear))

    # ----------------------------------------------------------------- terms, ms
    def lin(self, n: np.ndarray) -> np.ndarray:
        return np.interp(n, self.tokens, self.linear)

    def allreduce(self, n: np.ndarray) -> np.ndarray:
        """Two all-reduces per layer of the step's ``n`` tokens' activations; 0 at tp 1."""
        if self.ar is None:
            return np.zeros_like(n)
        return 2 * self.shape.layers * allreduce_ms(*self.ar, n * self.shape.hidden * ACT_BYTES)

    def head(self, rows: np.ndarray) -> np.ndarray:
        """The LM head for ``rows`` sampled rows: its weights at the achieved bandwidth, or
        its FLOPs at the datasheet peak, whichever is longer."""
        flops = 2.0 * self.shape.vocab * self.shape.hidden * rows / self.tp
        return np.maximum(self.head_bytes / self.bw, flops / self.peak) * 1e3

    def kv(self, tokens: np.ndarray) -> np.ndarray:
        """Reading or writing ``tokens`` tokens of KV at the achieved bandwidth."""
        return tokens * self.kv_token_bytes / self.bw * 1e3

    def attention(self, pairs: np.ndarray) -> np.ndarray:
        """A prefill's attention FLOPs (the roofline's, per query-key pair) at the datasheet peak."""
        return pairs * self.shape.attn_flops_per_pair / self.tp / self.peak * 1e3

    def step(self, prefill: np.ndarray, pairs: np.ndarray, rows: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """One step of ``prefill`` chunk tokens (``pairs`` query-key pairs) beside ``rows``
        decode rows holding ``ctx`` KV tokens in all; ms."""
        n = prefill + rows
        return (
            self.lin(n)
            + self.allreduce(n)
            + self.head(np.maximum(rows, 1.0))
            + self.kv(ctx + n)
            + self.attention(pairs)
            + self.overhead_ms
        )

    # ------------------------------------------------------------------ profile
    def profile(self, files: list[dict[str, str]]) -> dict[str, Any]:
        m, d, f = self.shape, self.device, np.asarray
        batch = [int(t) for t in self.tokens if t <= 512 or (t <= DECODE_MAX and t % 64 == 0)]
        ctxs = sorted({*(c for c in DECODE_CTX if c < m.max_context), m.max_context})
        b = f(batch, dtype=np.float64)
        dec = [self.step(0 * b, 0 * b, b, b * c) for c in ctxs]
        # Prefill and the measured parts: every token count to 1,024, then every 256 to 4,096
        # and every 2,048 beyond (the cost is close to linear in tokens there).
        keep = [t for t in self.tokens if t <= 1024 or (t <= 4096 and t % 256 == 0) or t % 2048 == 0]
        pt = f(keep, dtype=np.float64)
        pre = self.step(pt, pt * (pt + 1) / 2, 0 * pt, 0 * pt)
        rows_n, rows_t = (f([x[i] for x in PREFILL_ROWS], dtype=np.float64) for i in (0, 1))
        prows = self.step(rows_n * rows_t, rows_n * rows_t * (rows_t + 1) / 2, 0 * rows_n, 0 * rows_n)
        mp = f([c for c in MIXED_CHUNKS for _ in MIXED_ROWS], dtype=np.float64)
        mr = f([r for _ in MIXED_CHUNKS for r in MIXED_ROWS], dtype=np.float64)
        mixed = self.step(mp, mp * (mp + 1) / 2, mr, mr * MIXED_CTX)
        datasheet = d.bandwidth
        return {
            "schema": 1,
            "meta": {
                "device": d.name,
                "machine": {"kind": "cuda", "name": GPUS[self.gpu]["name"]},
                "datasheet": True,
                "model": m.name,
                "dtype": m.dtype,
                "measured_dtype": "fp16 (Vidur's tables; same bytes and tensor-core peak as bf16)",
                "tp": self.tp,
                "date": COMMIT_DATE,
                "source": {
                    "repo": REPO,
                    "commit": COMMIT,
                    "licence": LICENCE,
                    "citation": CITATION,
                    "model_dir": self.model_dir,
                    "files": files,
                },
                "derived_by": "python benchmarks/derive_gpu_profiles.py",
                "measured": [
                    f"linear and element-wise layers: the medians of {', '.join(LAYER_OPS)} x "
                    f"{m.layers} layers + emb once, per step token count (mlp.csv, "
                    f"num_tensor_parallel_workers={self.tp}; rows of one token count averaged; "
                    "linear between token counts)",
                ]
                + (
                    [
                        f"all-reduce: 2 per layer over {self.tp} GPUs of one NVLink node, message = "
                        f"step tokens x {m.hidden} x {ACT_BYTES} bytes, median ms linear in "
                        "size (all_reduce.csv, devices_per_node = num_workers; beyond the "
                        "largest size scaled by bytes)"
                    ]
                    if self.tp > 1
                    else []
                ),
                "modelled": {
                    "kv": "KV read (decode rows' context) and written (every step token) at the "
                    "achieved bandwidth",
                    "lm_head": f"vocab {m.vocab} x {m.hidden} / tp weights at the achieved "
                    "bandwidth, or 2 FLOPs per weight per decode row (at least 1) at the "
                    "datasheet peak, whichever is longer; no all-gather",
                    "attention": "decode: its KV read only (above); prefill: the roofline's "
                    f"{m.attn_flops_per_pair} FLOPs per query-key pair / tp at the datasheet "
                    "peak, plus the KV written",
                    "overhead_ms": self.overhead_ms,
                    "overhead": "the roofline's per-step overhead (DeviceSpec.step_overhead_s), "
                    "an assumption, not a measurement",
                    "prefill_rows": "equal prompts side by side, from the same model (not "
                    "measured): ProfileCost fits its attention cost per pair from them",
                    "mixed": f"a chunk beside decode rows at {MIXED_CTX} tokens each, from the "
                    "same model (linear layers on the step's total tokens; not measured)",
                },
                "bandwidth": {
                    "achieved_gbs": self.bw / 1e9,
                    "datasheet_gbs": datasheet / 1e9,
                    "achieved_fraction": self.bw / datasheet,
                    "how": "per GPU: the weight bytes of the layers' projections (q, k, v, o, "
                    f"gate, up, down: {self.linear_weight_bytes / 1e9:.3f} GB at tp {self.tp}) / "
                    f"the measured 1-token linear + element-wise time ({self.linear_1():.4f} ms)",
                },
                "peak_tflops": self.peak / 1e12,
                "vidur_vocab": self.vocab_csv,
            },
            "decode": {
                "batch": batch,
                "ctx": ctxs,
                "ms": [[_ms(dec[j][i]) for j in range(len(ctxs))] for i in range(len(batch))],
            },
            "prefill": {"tokens": [int(t) for t in pt], "ms": [_ms(x) for x in pre]},
            "prefill_rows": {
                "rows": [int(x) for x in rows_n],
                "tokens": [int(x) for x in rows_t],
                "ms": [_ms(x) for x in prows],
            },
            "mixed": {
                "prefill_tokens": [int(x) for x in mp],
                "decode_rows": [int(x) for x in mr],
                "decode_ctx": [MIXED_CTX] * len(mp),
                "ms": [_ms(x) for x in mixed],
            },
            "parts": {
                "tokens": [int(t) for t in pt],
                "linear_ms": [_ms(x) for x in self.lin(pt)],
                "allreduce_ms": [_ms(x, zero=True) for x in self.allreduce(pt)],
            },
        }


def _ms(x: float, zero: bool = False) -> float:
    """Milliseconds to 10 ns (the tables' own resolution is 1 us); > 0 unless ``zero``."""
    v = round(float(x), 5)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise SourceError(f"derived time {x!r} ms is not a positive number")
    return v


def name_of(gpu: str, model: str, tp: int) -> str:
    return f"{gpu}-{model}-tp{tp}.json"


def derive_all(source: Path) -> dict[str, dict[str, Any]]:
    """Every profile of :data:`PROFILES` from the tables under ``source``, by file name."""
    sums = _sums(source)
    out: dict[str, dict[str, Any]] = {}
    nets: dict[str, tuple[list[dict[str, str]], dict[str, str]]] = {}
    for gpu, model_dir, model, tps in PROFILES:
        text, rec = read_source(source, compute_path(gpu, model_dir), sums)
        mlp = _rows(text)
        for tp in tps:
            files = [rec]
            net = None
            if tp > 1:
                if gpu not in nets:
                    t, r = read_source(source, GPUS[gpu]["network"], sums)
                    nets[gpu] = (_rows(t), r)
                net, nrec = nets[gpu]
                files = [rec, nrec]
            d = Derived(gpu, model_dir, get_model(model), tp, mlp, net)
            out[name_of(gpu, model, tp)] = d.profile(files)
    return out


def dump(doc: Any, indent: int = 0) -> str:
    """JSON with one key per line and every list of numbers (a grid row) on one line."""
    pad = " " * (indent + 1)
    if isinstance(doc, dict) and doc:
        items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in doc.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}" + ("\n" if indent == 0 else "")
    if isinstance(doc, list) and any(isinstance(v, (dict, list)) for v in doc):
        items = [f"{pad}{dump(v, indent + 1)}" for v in doc]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--source",
        type=Path,
        default=SOURCE,
        help="Vidur's tables laid out as in its repository (compute/, network/, SHA256SUMS), "
        "plain or .gz (default: %(default)s)",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    try:
        docs = derive_all(a.source)
    except SourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        dest = a.out / name
        dest.write_text(dump(doc))
        print(f"wrote {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
