"""Step times interpolated in a profile the real engine measured (schema in :class:`ProfileCost`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .base import _VectorCost
from .devices import DeviceSpec, Machine, get_device, machine_of, same_machine
from .models import ModelShape, canonical_dtype, get_model

#: Where the committed profiles live (``data/profiles``, data/README.md): measured by
#: ``python -m batching measure`` (one file per machine and model), and under ``gpu/`` the
#: profiles derived from published GPU operator tables.
PROFILE_DIR = Path(__file__).resolve().parents[2] / "data" / "profiles"
GPU_PROFILE_DIR = PROFILE_DIR / "gpu"


class ProfileError(ValueError):
    """A profile file or dict that does not follow the schema; the message names the field."""


def _need(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ProfileError(f"profile field {field!r}: {msg}")


def _get(d: Any, field: str) -> Any:
    """``d[key]`` where ``field`` is the dotted path that ends in ``key``."""
    parent, _, key = field.rpartition(".")
    _need(isinstance(d, dict), parent or "<root>", "must be an object")
    _need(key in d, field, "missing")
    return d[key]


def _numbers(v: Any, field: str, lo: float = 0.0, n: int | None = None) -> np.ndarray:
    """A grid (``n`` None: at least 2 numbers >= ``lo``, strictly increasing) or ``n``
    times in milliseconds (each > 0), returned in seconds."""
    grid = n is None
    _need(
        isinstance(v, list) and (len(v) >= 2 if grid else len(v) == n),
        field,
        f"must be a list of {'at least 2' if grid else n} numbers",
    )
    _need(
        all(
            isinstance(x, (int, float))
            and not isinstance(x, bool)
            and math.isfinite(x)
            and (x >= lo if grid else x > 0)
            for x in v
        ),
        field,
        f"values must be finite numbers >= {lo}"
        if grid
        else "values must be finite numbers > 0 (milliseconds)",
    )
    a = np.asarray(v, dtype=np.float64)
    if not grid:
        return a / 1000.0
    _need(bool(np.all(np.diff(a) > 0)), field, "must be strictly increasing")
    return a


def _mixed_grid(
    mixed: dict[str, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float] | None:
    """The profile's mixed points as a grid (prefill tokens x decode rows at one context),
    or None unless every combination of at least two of each was measured exactly once."""
    if mixed is None or len(set(mixed["decode_ctx"].tolist())) != 1:
        return None
    P, R = np.unique(mixed["prefill_tokens"]), np.unique(mixed["decode_rows"])
    if len(P) < 2 or len(R) < 2 or len(mixed["ms"]) != len(P) * len(R) or P[0] < 1 or R[0] < 1:
        return None
    ms = np.full((len(P), len(R)), np.nan)
    for t, r, m in zip(mixed["prefill_tokens"], mixed["decode_rows"], mixed["ms"]):
        ms[np.searchsorted(P, t), np.searchsorted(R, r)] = m
    return None if np.isnan(ms).any() else (P, R, ms, float(mixed["decode_ctx"][0]))


def _points(data: dict, section: str, fields: dict[str, int]) -> dict[str, np.ndarray] | None:
    """An optional list-of-points section (``mixed``, ``prefill_rows``): ``ms`` (converted to
    seconds) and each of ``fields``, integers >= its minimum, as arrays; None if absent."""
    if data.get(section) is None:
        return None
    sec = data[section]
    ms = _get(sec, f"{section}.ms")
    _need(isinstance(ms, list) and len(ms) >= 1, f"{section}.ms", "must be a non-empty list")
    out = {"ms": _numbers(ms, f"{section}.ms", n=len(ms))}
    for k, lo in fields.items():
        v = _get(sec, f"{section}.{k}")
        _need(
            isinstance(v, list)
            and len(v) == len(ms)
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= lo for x in v),
            f"{section}.{k}",
            f"must be a list of {len(ms)} integers >= {lo}",
        )
        out[k] = np.asarray(v, dtype=np.float64)
    return out


def _pairs(tokens: Any) -> Any:
    """(query, key) pairs of causal attention over one fresh prompt of ``tokens`` tokens."""
    return tokens * (tokens + 1) / 2.0


def _fit_attention(tokens: np.ndarray, seconds: np.ndarray, rows: dict[str, np.ndarray] | None) -> float:
    """Seconds per attention pair from ``prefill_rows`` points: each is ``rows`` prompts of
    ``tokens`` each, set against one prompt of the same total (interpolated in the
    single-prompt grid; points outside it are not used). Same positions, fewer pairs: the
    time saved over the pairs saved, by least squares through zero; never negative."""
    if rows is None:
        return 0.0
    total = rows["rows"] * rows["tokens"]
    inside = (total >= tokens[0]) & (total <= tokens[-1])
    if not inside.any():
        return 0.0
    total = total[inside]
    single = _linear(tokens, seconds, total)
    saved_s = single - rows["ms"][inside]
    saved_pairs = _pairs(total) - rows["rows"][inside] * _pairs(rows["tokens"][inside])
    return max(float((saved_s * saved_pairs).sum() / (saved_pairs**2).sum()), 0.0)


def _positions(
    tokens: np.ndarray, seconds: np.ndarray, rows: dict[str, np.ndarray] | None, attn_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """What positions cost without their attention: the single prompts' curve less one
    sequence's pairs, extended by the ``prefill_rows`` points beyond the longest single prompt
    (a model's context caps a prompt, not a padded batch of them), one point per total."""
    lin_s = seconds - attn_s * _pairs(tokens)
    if rows is None or attn_s <= 0:
        return tokens, lin_s
    total = rows["rows"] * rows["tokens"]
    beyond = np.flatnonzero(total > tokens[-1])
    beyond = beyond[np.argsort(total[beyond], kind="stable")]
    t_b = total[beyond]
    s_b = rows["ms"][beyond] - attn_s * rows["rows"][beyond] * _pairs(rows["tokens"][beyond])
    keep = np.diff(t_b, prepend=-np.inf) > 0
    return np.concatenate((tokens, t_b[keep])), np.concatenate((lin_s, s_b[keep]))


def _segment(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the grid segment for ``x`` (edge segments beyond the grid) and the weight in it."""
    i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


def _linear(grid: np.ndarray, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    i, w = _segment(grid, x)
    return (1 - w) * values[i] + w * values[i + 1]


def _bilinear(g: np.ndarray, gx: np.ndarray, x: np.ndarray, gy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``g[i, j]`` (measured at ``gx[i]``, ``gy[j]``) interpolated at (``x``, ``y``)."""
    i, u = _segment(gx, x)
    j, v = _segment(gy, y)
    return (1 - u) * ((1 - v) * g[i, j] + v * g[i, j + 1]) + u * ((1 - v) * g[i + 1, j] + v * g[i + 1, j + 1])


def _profile_device(meta: Mapping[str, Any]) -> DeviceSpec:
    """The device a profile was measured on: the registry's entry, or, for a GPU the registry
    lacks (``meta.datasheet`` false), the entry measured in the same run (``meta.device_spec``,
    written by ``batching.real.hardware.measured_spec``)."""
    spec = meta.get("device_spec")
    if meta.get("datasheet") is False and isinstance(spec, Mapping):
        return DeviceSpec(
            **{**spec, "peak_flops": dict(spec["peak_flops"]), "notes": dict(spec.get("notes", {}))}
        )
    return get_device(meta["device"])


class ProfileCost(_VectorCost):
    """Step times interpolated in a profile the real engine measured.

    Schema 1 (``data/profiles/<device>-<model>.json``; times in milliseconds)::

        {"schema": 1,
         "meta": {"device": "h200", "model": "llama-8b", "dtype": "bf16",
                  "date": "2026-11-30", "torch": "2.13.0", "host": "..."},
         "decode": {"batch": [1, 2, 4, ...],        # rows per step, increasing
                    "ctx": [128, 1024, ...],          # KV tokens per row, increasing
                    "ms": [[...], ...]},              # ms[i][j]: batch[i] rows at ctx[j]
         "prefill": {"tokens": [32, 128, ...],      # one prompt from an empty cache
                     "ms": [...]},
         "mixed": {"prefill_tokens": [...], "decode_rows": [...],   # optional: measured
                   "decode_ctx": [...], "ms": [...]},               # mixed steps, ctx per row
         "prefill_rows": {"rows": [...], "tokens": [...],    # optional: rows equal prompts
                          "ms": [...]}}                       # of tokens each, one pass

    ``meta.device``/``meta.model``/``meta.dtype``/``meta.date`` are required (registry names;
    the model and device supply FLOPs, bytes and peaks for utilization); ``meta.tp``
    (optional, default 1) is the tensor-parallel degree of every step in the file (memory,
    peak and bandwidth then count that many devices); other meta fields are kept as given.

    Estimates:

    * decode: bilinear in (rows, mean KV per row);
    * prefill: linear in tokens, plus ``attn_s`` seconds per (query, key) pair for the
      step's pairs beyond one fresh prompt's (a padded static batch has fewer, a chunk after
      cached context more). ``attn_s`` is fitted to ``prefill_rows`` against the single
      prompt of the same total (least squares, >= 0; 0 without them); their points beyond
      the longest single prompt extend the curve (a padded batch can outgrow the context);
    * ``meta.token_buckets`` (optional): the runner pads a step's tokens up to the next
      bucket (CPU), so decode rows and prefill tokens are read at their bucket;
    * mixed step: bilinear over the ``mixed`` points where they form a grid (prefill tokens x
      decode rows, one context), see :meth:`_mixed`; otherwise prefill + decode -
      decode(batch[0], ctx[0]) (weights and launches paid once). On a CPU the additive form
      overcharges small mixed steps (16 decodes beside a 16-token chunk cost about a
      32-token prefill), hence the grid.

    Beyond the grids, the edge segment's line (counted in ``extrapolated``; every query in
    ``queries``), never below the cheapest measured step (``floor_s``). A ``mixed`` section
    that is not a grid only reports the mixed estimate's error (:meth:`describe`).
    """

    def __init__(
        self,
        meta: dict[str, Any],
        decode_batch: np.ndarray,
        decode_ctx: np.ndarray,
        decode_s: np.ndarray,
        prefill_tokens: np.ndarray,
        prefill_s: np.ndarray,
        model: ModelShape,
        device: DeviceSpec,
        mixed: dict[str, np.ndarray] | None = None,
        source: str | None = None,
        prefill_rows: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.meta, self.source = meta, source
        self.db, self.dc, self.ds = decode_batch, decode_ctx, decode_s
        self.pt, self.ps = prefill_tokens, prefill_s
        self.attn_s = _fit_attention(prefill_tokens, prefill_s, prefill_rows)
        self.pt_lin, self.ps_lin = _positions(prefill_tokens, prefill_s, prefill_rows, self.attn_s)
        self.model, self.device = model, device
        # meta.tp: the tensor-parallel degree the steps were measured (or derived) at; peak and
        # bandwidth count all its devices together, as the roofline's do.
        self.tp = int(meta.get("tp", 1))
        self.peak_flops = self.tp * device.peak(model.dtype)
        self.bandwidth = self.tp * device.bandwidth
        self.mixed = mixed
        self.mixed_grid = _mixed_grid(mixed)
        # The row counts the measured runner padded a step's tokens up to (meta.token_buckets,
        # see model.padded_tokens); None: no padding.
        tb = meta.get("token_buckets")
        self.buckets = None if tb is None else np.asarray(tb, dtype=np.float64)
        self.queries = 0
        self.extrapolated = 0
        self.floor_s = float(
            min([decode_s.min(), prefill_s.min()] + ([mixed["ms"].min()] if mixed is not None else []))
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ProfileCost:
        """Load a profile file; ProfileError naming the field if it breaks the schema."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ProfileError(f"{path}: not JSON ({e})") from e
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, device: DeviceSpec | None = None, source: str | None = None) -> ProfileCost:
        """Validate a profile dict (schema in the class docstring) and build the cost model;
        ``device`` overrides the lookup of ``meta.device``."""
        _need(isinstance(data, dict), "<root>", "must be an object")
        _need(_get(data, "schema") == 1, "schema", f"must be 1, got {data['schema']!r}")
        meta = _get(data, "meta")
        for k in ("device", "model", "dtype", "date"):
            _need(
                isinstance(_get(meta, f"meta.{k}"), str) and meta[k],
                f"meta.{k}",
                "must be a non-empty string",
            )
        tp = meta.get("tp", 1)
        _need(
            isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1,
            "meta.tp",
            "must be a positive integer (the tensor-parallel degree)",
        )
        if meta.get("token_buckets") is not None:
            _numbers(meta["token_buckets"], "meta.token_buckets", 1)
        try:
            dtype = canonical_dtype(meta["dtype"])
        except ValueError as e:
            raise ProfileError(f"profile field 'meta.dtype': {e}") from None
        try:
            key = "model"
            model = get_model(meta[key]).with_dtype(dtype)
            if device is None:
                key = "device"
                device = _profile_device(meta)
        except (ValueError, TypeError) as e:
            raise ProfileError(f"profile field 'meta.{key}': {e}") from None
        if dtype not in device.peak_flops:
            raise ProfileError(f"profile field 'meta.dtype': {device.name} has no {dtype} peak")

        dec = _get(data, "decode")
        batch = _numbers(_get(dec, "decode.batch"), "decode.batch", 1)
        ctx = _numbers(_get(dec, "decode.ctx"), "decode.ctx", 0)
        ms = _get(dec, "decode.ms")
        _need(
            isinstance(ms, list) and len(ms) == len(batch),
            "decode.ms",
            f"must be a list of {len(batch)} rows (one per decode.batch)",
        )
        decode_s = np.stack([_numbers(row, f"decode.ms[{i}]", n=len(ctx)) for i, row in enumerate(ms)])

        pre = _get(data, "prefill")
        tokens = _numbers(_get(pre, "prefill.tokens"), "prefill.tokens", 1)
        prefill_s = _numbers(_get(pre, "prefill.ms"), "prefill.ms", n=len(tokens))

        mixed = _points(data, "mixed", {"prefill_tokens": 0, "decode_rows": 0, "decode_ctx": 0})
        prows = _points(data, "prefill_rows", {"rows": 2, "tokens": 1})
        return cls(dict(meta), batch, ctx, decode_s, tokens, prefill_s, model, device, mixed, source, prows)

    # ------------------------------------------------------------- estimates
    def _decode(self, rows: np.ndarray, ctx_per_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = _bilinear(self.ds, self.db, rows, self.dc, ctx_per_row)
        out = (
            (rows < self.db[0])
            | (rows > self.db[-1])
            | (ctx_per_row < self.dc[0])
            | (ctx_per_row > self.dc[-1])
        )
        return np.maximum(t, 0.0), out

    def _prefill(self, tokens: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prefill of ``tokens`` positions whose attention spans ``pairs`` (query, key) pairs."""
        t = _linear(self.pt_lin, self.ps_lin, tokens) + self.attn_s * pairs
        return np.maximum(t, 0.0), (tokens < self.pt_lin[0]) | (tokens > self.pt_lin[-1])

    def _mixed(
        self, pt: np.ndarray, pa: np.ndarray, rows: np.ndarray, ctx_per_row: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mixed steps on the measured mixed grid, moved from its context to ``ctx_per_row``
        along the decode grid, with the attention of the step's own ``pa`` (query, key) pairs.

        The grid is read without its chunks' attention (each was a fresh prompt), so that a
        step whose chunks are many short prompts or read cached context pays its own pairs.
        Beyond the grid's largest chunk the grid's edge is extended along the prefill curve
        (what the extra positions cost in a prefill), not along the edge segment's line: a
        line drawn through the attention of two fresh prompts, then stripped of a much larger
        prompt's attention, priced a 2,205-token step of many short prompts below the same
        positions prefilled alone (681 against 1,007 ms, cpu-s)."""
        assert self.mixed_grid is not None, "called only where the profile has mixed steps"
        P, R, ms, c = self.mixed_grid
        lin = ms - self.attn_s * _pairs(P)[:, None]
        at = np.minimum(pt, P[-1])
        t = _bilinear(lin, P, at, R, rows)
        zero = np.zeros_like(pt)
        extra = self._prefill(pt, zero)[0] - self._prefill(at, zero)[0]  # 0 inside the grid
        t = t + extra + self.attn_s * pa
        d_step, d_out = self._decode(rows, ctx_per_row)
        d_grid, _ = self._decode(rows, np.full_like(rows, c))
        out = (pt < P[0]) | (pt > P[-1]) | (rows < R[0]) | (rows > R[-1]) | d_out
        return np.maximum(t + d_step - d_grid, 0.0), out

    def _padded(self, tokens: np.ndarray) -> np.ndarray:
        """Each token count raised to the smallest bucket >= it (unchanged beyond the last)."""
        if self.buckets is None:
            return tokens
        k = np.searchsorted(self.buckets, tokens)
        return np.where(k < len(self.buckets), self.buckets[np.minimum(k, len(self.buckets) - 1)], tokens)

    def _times(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any:
        if isinstance(pt, float):  # step_time's scalar call: the array path on length-1 arrays
            return self._times(*(np.array([v]) for v in (pt, pa, rows, ctx)))[0]
        has_d, has_p = rows > 0, pt > 0
        # A decode-only or prefill-only step costs what its padded token count costs, and
        # the profile's decode and prefill points sit on buckets: read them there. Mixed
        # grid points include their own totals' padding and are interpolated as measured.
        dec, d_out = self._decode(self._padded(rows), ctx / np.maximum(rows, 1.0))
        # Positions at the padded size (the linear layers run on the bucket), attention as
        # the step has it: one fresh prompt's, a padded static batch's many short ones, or
        # a chunk's that also reads its cached context.
        pre, p_out = self._prefill(self._padded(pt), pa)
        dec, pre = np.where(has_d, dec, 0.0), np.where(has_p, pre, 0.0)
        shared = np.where(has_d & has_p, self.ds[0, 0], 0.0)
        est = np.maximum(pre + dec - shared, np.maximum(pre, dec))
        both = has_d & has_p
        out = (has_d & d_out) | (has_p & p_out)
        if self.mixed_grid is not None and both.any():
            mix, m_out = self._mixed(pt, pa, np.maximum(rows, 1.0), ctx / np.maximum(rows, 1.0))
            est = np.where(both, mix, est)
            out = np.where(both, m_out, out)
        self.queries += int(np.count_nonzero(has_d | has_p))
        self.extrapolated += int(np.count_nonzero(out))
        return np.where(has_d | has_p, np.maximum(est, self.floor_s), est)

    def mixed_error(self) -> float | None:
        """Largest relative error of the mixed estimate against the profile's mixed points."""
        if self.mixed is None:
            return None
        m = self.mixed
        q, e = self.queries, self.extrapolated  # checking is not a query of the simulation
        est = self._times(
            m["prefill_tokens"],
            _pairs(m["prefill_tokens"]),
            m["decode_rows"],
            m["decode_rows"] * m["decode_ctx"],
        )
        self.queries, self.extrapolated = q, e
        return float(np.max(np.abs(est - m["ms"]) / m["ms"]))

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "profile",
            "source": self.source,
            "meta": self.meta,
            "model": self.model.name,
            "dtype": self.model.dtype,
            "device": self.device.name,
            "tp": self.tp,
            "decode_batch": self.db.tolist(),
            "decode_ctx": self.dc.tolist(),
            "prefill_tokens": self.pt.tolist(),
            "queries": self.queries,
            "extrapolated": self.extrapolated,
            "mixed_max_rel_err": self.mixed_error(),
            "attn_s_per_pair": self.attn_s,
            "mixed_estimate": "grid" if self.mixed_grid is not None else "additive",
        }


def profile_measured_here(model: str, here: Machine, directory: str | Path | None = None) -> str | None:
    """The committed profile of ``model`` measured on the machine ``here`` (its CPU model and
    threads, or its GPU), or None: every CPU's profile is filed as cpu-here, and another CPU's
    would price steps this one does not take."""
    for f in sorted(Path(directory or PROFILE_DIR).glob("*.json")):
        meta = json.loads(f.read_text()).get("meta", {})
        if meta.get("model") == model and same_machine(machine_of(meta), here):
            return str(f)
    return None
