"""Tests for batching.workloads.traces and batching.workloads.trace_files: Azure and Mooncake loaders, lookup,
quantile tables."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from batching.cli import main
from batching.workloads import trace_files
from batching.workloads.errors import WorkloadError
from batching.workloads.lengths import QUANTILE_DIR, Empirical, quantile_table
from batching.workloads.trace_files import TRACES, TraceError, find_trace
from batching.workloads.traces import load_azure, load_mooncake, load_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def azure_csv(tmp_path: Path, rows: list[str], header: str = HEADER, name: str = "trace.csv") -> Path:
    """A CRLF CSV like the real Azure files (7 fractional digits)."""
    p = tmp_path / name
    p.write_bytes(("\r\n".join([header] + rows) + "\r\n").encode())
    return p


def ts(seconds: float, base: str = "2023-11-16 18:15") -> str:
    """A timestamp ``seconds`` after ``base``:00 with 7 fractional digits."""
    whole = int(seconds)
    frac = round((seconds - whole) * 1e7)
    return f"{base}:{whole:02d}.{frac:07d}"


SIX = [
    f"{ts(t)},{p},{o}"
    for t, p, o in [(0, 100, 10), (1, 200, 20), (2, 300, 30), (3, 400, 40), (4, 500, 50), (5, 600, 60)]
]


def mooncake_jsonl(tmp_path: Path, recs: list[dict[str, object]] | list[str], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return p


def mc(t: int, i: int = 100, o: int = 10) -> dict[str, object]:
    return {"timestamp": t, "input_length": i, "output_length": o, "hash_ids": [0, 1]}


def gzipped(path: Path, *, keep: bool = True) -> Path:
    """``path`` compressed beside it as ``path.gz`` (as data/traces ships them)."""
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    if not keep:
        path.unlink()
    return gz


# --------------------------------------------------------------------- Azure
def test_azure_exact_arrivals_crlf_7_digits(tmp_path: Path) -> None:
    p = azure_csv(tmp_path, ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:48.1805900,396,109"])
    w = load_azure(p)
    assert w.arrivals.tolist() == [0.0, 1.5]
    assert w.prompt_lens.tolist() == [374, 396] and w.output_lens.tolist() == [44, 109]
    assert w.rids == (0, 1)
    info = w.info
    assert info["file"] == str(p) and info["epoch"] == "2023-11-16 18:15:46.680590"
    assert "Splitwise" in info["attribution"] and "CC BY 4.0" in info["attribution"]
    assert info["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()


def test_azure_reordered_columns_and_trailing_blank_lines(tmp_path: Path) -> None:
    p = azure_csv(
        tmp_path, ["5,2023-11-16 18:15:00.0000000,7", ""], header="GeneratedTokens,TIMESTAMP,ContextTokens"
    )
    w = load_azure(p)
    assert (w.prompt_lens.tolist(), w.output_lens.tolist()) == ([7], [5])


@pytest.mark.parametrize(
    "header, rows, pattern",
    [
        ("TIMESTAMP,Context,GeneratedTokens", SIX[:1], r"line 1: missing column\(s\) 'ContextTokens'"),
        (
            HEADER,
            [SIX[0], "2023-13-16 18:15:01.0000000,5,5"],
            r"line 3, column 'TIMESTAMP': '2023-13-16 18:15:01\.0000000' is not a timestamp",
        ),
        (HEADER, [SIX[0], "yesterday,5,5"], r"line 3, column 'TIMESTAMP': 'yesterday'"),
        (HEADER, [f"{ts(0)},12,1a"], r"line 2, column 'GeneratedTokens': '1a' is not an integer"),
        (HEADER, [f"{ts(0)},2.5,3"], r"line 2, column 'ContextTokens': '2\.5' is not an integer"),
        (HEADER, [SIX[0], f"{ts(1)},0,3"], r"line 3, column 'ContextTokens': 0 tokens; lengths must be >= 1"),
        (HEADER, [f"{ts(1)},4,-2"], r"line 2, column 'GeneratedTokens': -2 tokens"),
        (
            HEADER,
            [SIX[0], SIX[2], SIX[1]],
            r"line 4, column 'TIMESTAMP': '2023-11-16 18:15:01\.0000000' is earlier than line 3's",
        ),
        (HEADER, [SIX[0], f"{ts(1)},4"], r"line 3: 2 fields"),
        (HEADER, [], r"header only, no requests"),
    ],
)
def test_azure_errors_name_line_column_value(
    tmp_path: Path, header: str, rows: list[str], pattern: str
) -> None:
    p = azure_csv(tmp_path, rows, header=header, name="bad.csv")
    with pytest.raises(TraceError, match=pattern) as e:
        load_azure(p)
    assert str(p) in str(e.value)


def test_azure_empty_file_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.csv"
    p.write_bytes(b"")
    with pytest.raises(TraceError, match=re.escape(f"{p}: empty file")):
        load_azure(p)
    with pytest.raises(TraceError, match="cannot open Azure trace .*nope.csv"):
        load_azure(tmp_path / "nope.csv")


def test_azure_window_limit(tmp_path: Path) -> None:
    p = azure_csv(tmp_path, SIX)
    w = load_azure(p, window=(1, 4))
    assert len(w) == 3 and w.arrivals.tolist() == [0.0, 1.0, 2.0]
    assert w.prompt_lens.tolist() == [200, 300, 400]
    assert w.info["t_offset_s"] == 1.0 and w.info["window_s"] == [1.0, 4.0]
    assert w.info["epoch"] == "2023-11-16 18:15:01"
    assert len(load_azure(p, limit=2)) == 2
    w = load_azure(p, window=(1.5, float("inf")), limit=2)
    assert w.prompt_lens.tolist() == [300, 400] and w.arrivals.tolist() == [0.0, 1.0]
    assert w.info["rows_in_file"] == 6 and w.info["rows_selected"] == 2
    with pytest.raises(TraceError, match=r"no requests in window=\(10\.0, 20\.0\)"):
        load_azure(p, window=(10, 20))
    with pytest.raises(WorkloadError, match="limit=0"):
        load_azure(p, limit=0)
    with pytest.raises(WorkloadError, match=r"window=\(3, 1\)"):
        load_azure(p, window=(3, 1))


# ------------------------------------------------------------------ Mooncake
def test_mooncake_buckets_spread(tmp_path: Path) -> None:
    recs = [mc(0), mc(0), mc(0), mc(3000), mc(3000, o=1), mc(5999), mc(5999), mc(9000)]
    p = mooncake_jsonl(tmp_path, recs)
    w = load_mooncake(p)
    # 3 s bucket over 3 requests; then 2 over 2.999 s (the gap to the next stamp), then 2 over 3 s.
    assert w.arrivals.tolist() == pytest.approx([0, 1, 2, 3, 4.4995, 5.999, 7.499, 9.0])
    assert w.output_lens.tolist()[4] == 1  # output length 1 occurs in the real trace
    assert "spread" in w.info["spread"] and "Qin et al." in w.info["attribution"]
    raw = load_mooncake(p, spread=False)
    assert raw.arrivals.tolist() == [0, 0, 0, 3, 3, 5.999, 5.999, 9]
    assert raw.info["spread"] is False
    assert np.all(np.diff(w.arrivals) > 0)


def test_mooncake_options(tmp_path: Path) -> None:
    p = mooncake_jsonl(tmp_path, [mc(0, 500, 20), mc(0, 100), mc(3000, 300), mc(6000, 50)])
    w = load_mooncake(p, window=(1.0, 7.0))
    assert w.prompt_lens.tolist() == [100, 300, 50] and w.arrivals.tolist() == pytest.approx([0, 1.5, 4.5])
    assert len(load_mooncake(p, limit=3)) == 3


@pytest.mark.parametrize(
    "recs, pattern",
    [
        ([mc(0), mc(0, o=0)], r"line 2, field 'output_length': 0 tokens"),
        ([mc(0), {"timestamp": 5, "input_length": 3}], r"line 2: missing field 'output_length'"),
        ([mc(0), "{not json"], r"line 2: not valid JSON"),
        ([mc(3000), mc(0)], r"line 2, field 'timestamp': 0 is earlier than line 1's 3000"),
        (
            [mc(0), {"timestamp": 1, "input_length": "12", "output_length": 3}],
            r"line 2, field 'input_length': '12' is not an integer",
        ),
        (
            [{"timestamp": "soon", "input_length": 1, "output_length": 3}],
            r"line 1, field 'timestamp': 'soon'",
        ),
        ([], r"empty file"),
    ],
)
def test_mooncake_errors(tmp_path: Path, recs: list[object], pattern: str) -> None:
    p = mooncake_jsonl(tmp_path, recs, name="bad.jsonl")  # type: ignore[arg-type]
    with pytest.raises(TraceError, match=pattern) as e:
        load_mooncake(p)
    assert str(p) in str(e.value)


# ------------------------------------------------------------ compressed
def test_gz_trace_loads_as_its_plain_file(tmp_path: Path) -> None:
    plain_azure = azure_csv(tmp_path, SIX)
    plain_mc = mooncake_jsonl(tmp_path, [mc(0, 500), mc(0, 100, 3), mc(3000, 300, 7)])
    for plain, load in ((plain_azure, load_azure), (plain_mc, load_mooncake)):
        gz = gzipped(plain)
        a = load(plain)
        for w in (load(gz), load_trace(gz), load_trace(str(gz))):
            assert w.arrivals.tolist() == a.arrivals.tolist()
            assert w.prompt_lens.tolist() == a.prompt_lens.tolist()
            assert w.output_lens.tolist() == a.output_lens.tolist()
            # The uncompressed text's sha256, so a .gz names the same trace as its original.
            assert w.info["sha256"] == a.info["sha256"] == hashlib.sha256(plain.read_bytes()).hexdigest()
            assert w.info["file"] == str(gz) and w.name == a.name == plain.stem
            assert w.info["format"] == a.info["format"]


def test_gz_trace_errors_name_the_gz(tmp_path: Path) -> None:
    bad_row = gzipped(azure_csv(tmp_path, [SIX[0], f"{ts(1)},4"], name="rows.csv"))
    with pytest.raises(TraceError, match=re.escape(f"{bad_row}, line 3: 2 fields")):
        load_trace(bad_row)
    not_gzip = tmp_path / "plain.csv.gz"
    not_gzip.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
    with pytest.raises(TraceError, match=re.escape(f"cannot open Azure trace {not_gzip}")):
        load_trace(not_gzip)
    good = gzipped(mooncake_jsonl(tmp_path, [mc(0)] * 50))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(good.read_bytes()[:-12])
    with pytest.raises(TraceError, match=re.escape(f"cannot open Mooncake trace {cut}")):
        load_trace(cut)
    (tmp_path / "x.parquet.gz").write_bytes(b"")
    with pytest.raises(TraceError, match=r"extension '\.parquet'"):
        load_trace(tmp_path / "x.parquet.gz")


SHIPPED = Path(trace_files.__file__).resolve().parents[2] / "data" / "traces"


@pytest.mark.parametrize("name", list(TRACES))
def test_shipped_trace_is_the_original_and_documented(name: str) -> None:
    gz = SHIPPED / (TRACES[name]["path"] + ".gz")
    data = gz.read_bytes()
    assert hashlib.sha256(gzip.decompress(data)).hexdigest() == TRACES[name]["sha256"]
    # gzip -n: no file name (FLG bit 3) and mtime 0 in the header, so the bytes are reproducible.
    assert not data[3] & 0x08 and data[4:8] == b"\0\0\0\0"
    readme = (SHIPPED / "README.md").read_text()
    assert TRACES[name]["sha256"] in readme and hashlib.sha256(data).hexdigest() in readme
    assert f"{len(data):,}" in readme  # the compressed size the README gives


def test_shipped_licences() -> None:
    readme = (SHIPPED / "README.md").read_text()
    for needed in ("CC BY 4.0", "creativecommons.org/licenses/by/4.0", "Splitwise", "b469a11", "3b5a594"):
        assert needed in readme
    apache = (SHIPPED / "mooncake-2025" / "LICENSE-2.0.txt").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in apache
    assert "END OF TERMS AND CONDITIONS" in apache


# ------------------------------------------------------------- finding
@pytest.fixture
def no_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every lookup location into tmp_path (env dir, repo sibling, repo data, cache)."""
    monkeypatch.setenv("BATCHING_TRACES", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(trace_files, "_repo_root", lambda: tmp_path / "repo")
    return tmp_path


def test_load_trace_dispatch(tmp_path: Path) -> None:
    a = load_trace(azure_csv(tmp_path, SIX[:2]), limit=1)
    assert len(a) == 1 and a.info["format"] == "azure-2023-csv"
    m = load_trace(str(mooncake_jsonl(tmp_path, [mc(0)])), spread=False)
    assert m.info["format"] == "mooncake-jsonl"
    (tmp_path / "x.parquet").write_text("")
    with pytest.raises(TraceError, match=r"extension '\.parquet'"):
        load_trace(tmp_path / "x.parquet")


def test_named_trace_not_found_says_where(no_traces: Path) -> None:
    with pytest.raises(TraceError) as e:
        load_trace("azure-conv")
    msg = str(e.value)
    rel = "azure-2023/AzureLLMInferenceTrace_conv.csv"
    for d in ("env", "shared/traces", "repo/data/traces", "cache/batching/traces"):
        assert f"{no_traces / d / rel}[.gz]" in msg
    # Worded for the command line and Python alike: no keyword argument of one of them.
    assert "BATCHING_TRACES" in msg and "--download" in msg and "download=True" not in msg
    assert TRACES["azure-conv"]["url"] in msg
    with pytest.raises(
        TraceError, match="unknown trace 'azure'; known traces: azure-conv, azure-code, mooncake-conv"
    ):
        find_trace("azure")


def test_named_trace_found_via_env(no_traces: Path) -> None:
    d = no_traces / "env" / "azure-2023"
    d.mkdir(parents=True)
    azure_csv(d, SIX, name="AzureLLMInferenceTrace_conv.csv")
    w = load_trace("azure-conv", limit=4)
    assert len(w) == 4 and w.name == "AzureLLMInferenceTrace_conv"


def test_lookup_order(no_traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rel = Path(TRACES["azure-conv"]["path"])
    dirs = [
        no_traces / "env",
        no_traces / "shared" / "traces",
        no_traces / "repo" / "data" / "traces",
        no_traces / "cache" / "batching" / "traces",
    ]
    assert trace_files.trace_dirs() == dirs
    # Directory i holds a trace of i + 1 rows: compressed in env and the repo's data, plain elsewhere.
    found = []
    for i, d in enumerate(dirs):
        (d / rel.parent).mkdir(parents=True)
        p = azure_csv(d / rel.parent, SIX[: i + 1], name=rel.name)
        found.append(gzipped(p, keep=False) if i in (0, 2) else p)
    for i, want in enumerate(found):
        assert find_trace("azure-conv") == want and len(load_trace("azure-conv")) == i + 1
        want.unlink()
    with pytest.raises(TraceError, match="not found"):
        find_trace("azure-conv")
    # Both copies in one directory: the plain file.
    plain = azure_csv(dirs[1] / rel.parent, SIX, name=rel.name)
    gzipped(plain)
    assert find_trace("azure-conv") == plain
    monkeypatch.delenv("BATCHING_TRACES")
    assert trace_files.trace_dirs() == dirs[1:]


def test_cli_download_reaches_find_trace(
    no_traces: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fetched = azure_csv(no_traces, SIX, name="fetched.csv")
    calls: list[tuple[str, Path]] = []

    def fake_download(name: str, dest: Path) -> Path:  # no network: the file is already here
        calls.append((name, dest))
        return fetched

    monkeypatch.setattr(trace_files, "_download", fake_download)
    args = ["simulate", "--trace", "azure-code", "--scheduler", "static", "--slots", "2", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "trace 'azure-code' not found" in err and "--download" in err and not calls
    assert main([*args, "--download"]) == 0
    rel = TRACES["azure-code"]["path"]
    assert calls == [("azure-code", no_traces / "cache" / "batching" / "traces" / rel)]
    assert "static | fetched (6 requests)" in capsys.readouterr().out


def test_download_checks_sha(no_traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = azure_csv(no_traces, SIX, name="remote.csv")
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    entry = dict(trace_files.TRACES["azure-code"], url=src.as_uri(), sha256="0" * 64)
    monkeypatch.setitem(trace_files.TRACES, "azure-code", entry)
    dest = no_traces / "cache" / "batching" / "traces" / entry["path"]
    with pytest.raises(TraceError, match="has sha256 .* expected 0000"):
        load_trace("azure-code", download=True)
    assert not dest.exists() and not list(dest.parent.glob("*.part"))
    monkeypatch.setitem(trace_files.TRACES, "azure-code", dict(entry, sha256=good))
    assert len(load_trace("azure-code", download=True)) == 6
    assert dest.is_file()


# ------------------------------------------------------- committed quantiles
@pytest.mark.parametrize(
    "name, stats",
    [
        # min, p10, p50, p90, p99, max of the original files (linear interpolation), known
        # beforehand; data/length_quantiles/ holds the same rows.
        (
            "azure-conv",
            {"prompt": [2, 207, 1020, 2734.5, 4142, 14050], "output": [7, 54, 129, 424, 601, 1000]},
        ),
        ("azure-code", {"prompt": [3, 147, 1469, 5187.6, 7436, 7437], "output": [6, 7, 13, 55, 251.5, 1899]}),
    ],
)
def test_committed_quantile_tables(name: str, stats: dict[str, list[float]]) -> None:
    path = QUANTILE_DIR / f"{name}.csv"
    text = path.read_text()
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for needed in ("b469a11", "CC BY 4.0", "Splitwise", "Generated", "derive_quantiles.py"):
        assert needed in comments
    for col, want in stats.items():
        e = quantile_table(name, col)  # type: ignore[arg-type]
        assert len(e.q) == 101 and e.q[1] == 0.01
        got = e.quantile(np.array([0, 0.1, 0.5, 0.9, 0.99, 1.0]))
        assert got.tolist() == pytest.approx(want, abs=0.05)


# -------------------------------------------------------------- real traces
def _real(name: str) -> Path | None:
    try:
        return find_trace(name)
    except TraceError:
        return None


AZURE_CONV, AZURE_CODE, MOONCAKE = _real("azure-conv"), _real("azure-code"), _real("mooncake-conv")
needs_azure = pytest.mark.skipif(
    AZURE_CONV is None or AZURE_CODE is None, reason="Azure traces not available"
)


@needs_azure
def test_real_azure_traces_match_readme() -> None:
    conv, code = load_trace("azure-conv"), load_trace("azure-code")
    assert (len(conv), len(code)) == (19366, 8819)
    assert conv.duration == pytest.approx(3501.7, abs=0.05) and code.duration == pytest.approx(
        3435.9, abs=0.05
    )
    assert conv.info["trace"] == "azure-conv" and code.info["trace"] == "azure-code"  # sha256 as in README
    for w, p50s, means in [(conv, (1020, 129), (1154.7, 211.1)), (code, (1469, 13), (2047.8, 27.9))]:
        assert (np.median(w.prompt_lens), np.median(w.output_lens)) == p50s
        assert (w.prompt_lens.mean(), w.output_lens.mean()) == pytest.approx(means, abs=0.05)
    gaps = np.diff(code.arrivals)
    assert gaps.std() / gaps.mean() == pytest.approx(13.2, abs=0.05)
    # Both traces interleaved on their wall clocks (they cover the same hour).
    wall = [datetime.fromisoformat(str(w.info["epoch"])).timestamp() + w.arrivals for w in (conv, code)]
    a = np.concatenate(wall)
    order = np.argsort(a, kind="stable")
    both = np.concatenate([conv.output_lens, code.output_lens])[order]
    assert len(both) == 28185 and len(both) / (a.max() - a.min()) == pytest.approx(8.0, abs=0.05)
    # Static batches of 32 consecutive requests: useful fraction of decode slots.
    for lens, want in [(conv.output_lens, 0.38), (code.output_lens, 0.12), (both, 0.30)]:
        o = lens[: len(lens) // 32 * 32].reshape(-1, 32)
        assert o.sum() / (32 * o.max(axis=1)).sum() == pytest.approx(want, abs=0.005)


@needs_azure
def test_committed_tables_regenerate_from_traces() -> None:
    for name, path in (("azure-conv", AZURE_CONV), ("azure-code", AZURE_CODE)):
        w = load_azure(path)  # type: ignore[arg-type]
        for col, lens in (("prompt", w.prompt_lens), ("output", w.output_lens)):
            e = Empirical.from_csv(QUANTILE_DIR / f"{name}.csv", col)
            assert np.array(e.values) == pytest.approx(np.percentile(lens, np.array(e.q) * 100), abs=1e-3)


@pytest.mark.skipif(MOONCAKE is None, reason="Mooncake trace not available")
def test_real_mooncake_trace() -> None:
    w = load_trace("mooncake-conv")
    assert len(w) == 12031 and w.info["trace"] == "mooncake-conv"
    assert w.duration == pytest.approx(3537, abs=3)
    assert np.median(w.prompt_lens) == 6909 and np.percentile(w.prompt_lens, 90) == 27367
    assert np.median(w.output_lens) == 350 and w.output_lens.min() == 1
    assert np.all(np.diff(w.arrivals) > 0)  # spread leaves no two requests at one instant
    capped, _ = load_trace("mooncake-conv", limit=200).cap_to_context(8192, "cap")
    assert len(capped) == 200 and capped.info["capped"]["n_capped"] > 0
    assert (capped.prompt_lens + capped.output_lens).max() <= 8192
