"""Decode graphs (graphs.py): the fixed-shape step a CUDA graph replays, run eagerly on the CPU.

Capturing needs a GPU; everything a graph replays (bucket padding, the scratch slab, the
slot gather, the context mask, GQA as grouped queries) is the same code run eagerly, and
it must give the eager path's logits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_model import F64, TINY, admitted, commit

from batching.plan import PrefillChunk, StepPlan
from batching.real.executor import run_real
from batching.real.graphs import batch_bucket, ctx_bucket
from batching.real.model import Llama, gqa_decode, sdpa
from batching.real.runner import ModelRunner, kv_cache_bytes
from batching.schedulers import make_scheduler
from batching.workloads import Workload

pytestmark = pytest.mark.model


def test_batch_buckets_double_to_8_then_step_by_8_capped_at_the_slots() -> None:
    assert [batch_bucket(b, 256) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 24, 25, 200)] == [
        1,
        2,
        4,
        4,
        8,
        8,
        16,
        16,
        24,
        24,
        32,
        200,
    ]
    assert batch_bucket(13, 12 + 1) == 13 and batch_bucket(11, 12) == 12  # never above the slots
    for bad in (0, 13):
        with pytest.raises(ValueError, match=f"rows={bad}"):
            batch_bucket(bad, 12)


def test_ctx_buckets_are_powers_of_two_to_1024_then_multiples_of_512() -> None:
    assert [ctx_bucket(n, 8192) for n in (1, 64, 65, 129, 1000, 1024, 1025, 1537, 8000)] == [
        64,
        64,
        128,
        256,
        1024,
        1024,
        1536,
        2048,
        8192,
    ]
    assert (
        ctx_bucket(40, 48) == 48 and ctx_bucket(3000, 3074) == 3072 and ctx_bucket(3073, 3074) == 3074
    )  # capped at the slab
    with pytest.raises(ValueError, match="length=49"):
        ctx_bucket(49, 48)


def test_grouped_query_decode_attention_equals_sdpa_gqa() -> None:
    """H=8 query heads over K=2 kv heads, as 4 queries per kv head: the same numbers as
    sdpa's repeat_interleave convention, masked rows included."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 8, 16, generator=g, dtype=F64)
    k, v = (torch.randn(3, 2, 10, 16, generator=g, dtype=F64) for _ in range(2))
    mask = (torch.arange(10)[None, :] <= torch.tensor([2, 9, 5])[:, None])[:, None, None, :]
    ref = sdpa(q.unsqueeze(2), k, v, mask).squeeze(2)
    torch.testing.assert_close(gqa_decode(q, k, v, mask), ref, rtol=0, atol=1e-13)


def test_grouped_query_chunk_attention_equals_sdpa_gqa() -> None:
    """A prefill chunk after cached context packed as G x m queries per kv head (the eager
    path's masked call, which must not fall back to the math kernel on a GPU): the same
    numbers as sdpa's grouped-query call with the same mask."""
    from batching.real.model import gqa_chunk

    g = torch.Generator().manual_seed(1)
    m, start = 5, 7
    q = torch.randn(m, 8, 16, generator=g, dtype=F64)
    k, v = (torch.randn(1, 2, start + m, 16, generator=g, dtype=F64) for _ in range(2))
    mask = torch.arange(start + m)[None, :] <= torch.arange(start, start + m)[:, None]  # [m, end]
    ref = sdpa(q.transpose(0, 1)[None], k, v, mask)[0].transpose(0, 1)
    torch.testing.assert_close(gqa_chunk(q, k, v, mask), ref, rtol=0, atol=1e-13)


def test_attention_backends_are_recorded(model64: Llama) -> None:
    """Which SDPA kernel each path selects on this device (a GPU check fails bf16 on math)."""
    from torch.nn.attention import SDPBackend

    got = ModelRunner(model64, slots=2, max_len=16, decode_attention="sdpa").attention_backends()
    names = {b.lower() for b in SDPBackend.__members__}
    assert set(got) == {"decode", "prefill", "chunk"} and set(got.values()) <= names
    runner = ModelRunner(model64, slots=2, max_len=16)
    if runner.decode_kernel is not None:  # the CPU's decode kernel is named instead of SDPA's
        assert runner.attention_backends()["decode"].startswith("rows at their own length")


def test_a_decode_graph_reads_the_same_slabs_whatever_the_slot_count(model64: Llama) -> None:
    """The graphed read depends on the rows and their slots, not on the runner's slot count
    (a profile built with 257 slots and a run with 33 must time the same kernel): with 6 or
    40 slots the step lands in the same bucket and gives bit-identical logits."""
    logits, keys = [], []
    for slots in (6, 40):
        runner = ModelRunner(model64, slots=slots, max_len=96, graphs=True)
        reqs = [admitted(i, 10 + 7 * i, 3, slot=s) for i, s in enumerate((0, 1, 3))]
        first = StepPlan(prefills=[PrefillChunk(r, r.prompt_len) for r in reqs])
        commit(first, runner.forward(first), 1.0)
        out = runner.forward(StepPlan(decodes=reqs))
        logits.append(torch.stack([out.logits[r.rid] for r in reqs]))
        keys.append(runner.graphs.keys)
    assert keys == [[(4, 64)], [(4, 64)]]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)


def test_capture_all_makes_only_the_buckets_a_workload_reaches(model64: Llama) -> None:
    runner = ModelRunner(model64, slots=6, max_len=160, graphs=True)
    assert runner.graphs.capture_all(max_rows=2, max_ctx=50) == 2
    assert runner.graphs.keys == [(1, 64), (2, 64)]
    assert runner.graphs.capture_all() == 4 * 3  # rows 1, 2, 4, 6 x contexts 64, 128, 160


def test_a_dropped_runner_is_freed_at_once(model64: Llama) -> None:
    """The runner holds its graphs, the graphs hold the model and the cache, nothing holds the
    runner: with the garbage collector off, dropping it frees its slabs and graph pool."""
    import gc
    import weakref

    runner = ModelRunner(model64, slots=2, max_len=16, graphs=True)
    refs = [weakref.ref(runner), weakref.ref(runner.cache), weakref.ref(runner.graphs)]
    gc.disable()
    try:
        del runner
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()


def test_the_graphs_module_does_not_import_the_runner() -> None:
    import subprocess
    import sys

    code = "import sys, batching.real.graphs; print('batching.real.runner' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "rows, bucket",
    [
        ([(9, 1), (3, 0), (20, 2)], (4, 64)),
        ([(9, 4), (3, 0), (20, 2)], (6, 64)),
        ([(70, 3)], (4, 128)),
        ([(30, 0)], (1, 64)),
    ],
)
def test_fixed_shape_decode_step_equals_the_eager_step(
    model64: Llama, rows: list[tuple[int, int]], bucket: tuple[int, int]
) -> None:
    """(prompt, slot) rows among 6 slots: a bucket holds the rows and every slot up to the
    highest (3 rows in slots 0-2 padded to 4; in slots 0, 2 and 4 to 6; one row in slot 3
    to 4 at context 128; one in slot 0 alone) and reads exactly those slabs. Every row's
    logits equal the eager runner's in float64; padding rows wrote only the scratch slab."""
    eager = ModelRunner(model64, slots=6, max_len=160, graphs=False)
    fixed = ModelRunner(model64, slots=6, max_len=160, graphs=True)
    assert fixed.cache.k.shape[1] == 7 and fixed.cache.nbytes == kv_cache_bytes(TINY, 7, 160, F64)
    outs = []
    for runner in (eager, fixed):
        reqs = [admitted(i, p, 5, slot=s) for i, (p, s) in enumerate(rows)]
        first = StepPlan(prefills=[PrefillChunk(r, r.prompt_len) for r in reqs])
        commit(first, runner.forward(first), 1.0)
        steps = []
        for t in range(3):
            plan = StepPlan(decodes=reqs)
            out = runner.forward(plan)
            commit(plan, out, 2.0 + t)
            steps.append(out)
        outs.append(steps)
    for e, f in zip(*outs):
        assert e.token_ids == f.token_ids
        for rid in e.logits:
            torch.testing.assert_close(f.logits[rid], e.logits[rid], rtol=0, atol=1e-11)
    assert fixed.graphs.keys == [bucket] and fixed.graphs.captures == 0  # nothing captured on a CPU
    assert fixed.graphs_info() == {
        "captured": 0,
        "replayed_as_graphs": False,
        "buckets": [list(bucket)],
        "failed": {},
        "eager_steps": 0,
    }
    assert eager.graphs_info() is None
    # Slabs no request used are still zero; padding rows (if any) wrote the scratch slab.
    for s in set(range(6)) - {s for _, s in rows}:
        assert not fixed.cache.k[:, s].any() and not fixed.cache.v[:, s].any()
    assert bool(fixed.cache.k[:, 6].any()) == (bucket[0] > len(rows))


def test_graphs_give_every_scheduler_the_eager_tokens(model64: Llama) -> None:
    """A small workload through static, continuous and chunked schedules with the fixed-shape
    decode step: each request's tokens equal the eager run's."""
    w = Workload.from_arrays([0.0, 0.0, 0.01, 0.02, 0.03], [5, 17, 3, 9, 30], [6, 2, 9, 4, 3])
    for name in ("static", "continuous", "chunked"):
        runs = []
        for graphs in (False, True):
            runner = ModelRunner(model64, slots=3, max_len=64, graphs=graphs)
            sch = make_scheduler(name, max_context=64, slots=3, token_budget=8, kv_capacity=3 * 64)
            runs.append(run_real(w, sch, None, runner=runner))
        tok = [{r.rid: r.token_ids for r in res.requests} for res in runs]
        assert tok[0] == tok[1], name
        assert all(len(t) == r.output_len for r, t in zip(runs[1].requests, tok[1].values()))


def test_capture_needs_a_cuda_device(model64: Llama) -> None:
    from batching.real.graphs import DecodeGraphs

    runner = ModelRunner(model64, slots=2, max_len=16, graphs=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        DecodeGraphs(runner.model, runner.cache, capture=True)


def test_a_failed_capture_falls_back_to_eager_steps_and_says_why(model64: Llama, monkeypatch) -> None:
    """A bucket that cannot be captured (an op CUDA graphs refuse, out of memory) must not
    lose the run: its steps run eagerly with the same logits, the runner warns once and
    records the bucket and the reason for the results file; other buckets still replay."""
    from batching.real.graphs import DecodeGraphs, GraphCaptureError

    make = DecodeGraphs._make

    def refuse(self, rows: int, length: int):
        if rows == 2:
            raise GraphCaptureError(
                f"capturing the decode graph of {rows} rows x {length} positions failed: nope"
            )
        return make(self, rows, length)

    eager = ModelRunner(model64, slots=2, max_len=32, graphs=False)
    fixed = ModelRunner(model64, slots=2, max_len=32, graphs=True)
    monkeypatch.setattr(DecodeGraphs, "_make", refuse)
    outs: list[list] = [[], []]
    for i, runner in enumerate((eager, fixed)):
        r = admitted(0, 5, 4, slot=1)  # slot 1: the bucket of 2 rows, which fails
        s = admitted(1, 7, 4, slot=0)  # alone in slot 0: the bucket of 1 row, which replays
        first = StepPlan(prefills=[PrefillChunk(r, 5), PrefillChunk(s, 7)])
        commit(first, runner.forward(first), 1.0)
        for t, plan in enumerate([StepPlan(decodes=[r]), StepPlan(decodes=[r]), StepPlan(decodes=[s])]):
            if runner is fixed and t == 0:
                with pytest.warns(
                    RuntimeWarning, match="2 rows x 32 positions failed: nope; steps of this bucket"
                ):
                    out = runner.forward(plan)
            else:
                out = runner.forward(plan)
            commit(plan, out, 2.0 + t)
            outs[i].append(out)
    for e, f in zip(*outs):
        for rid in e.logits:
            torch.testing.assert_close(f.logits[rid], e.logits[rid], rtol=0, atol=1e-11)
    info = fixed.graphs_info()
    assert info is not None and fixed.graphs is not None
    assert list(info["failed"]) == ["2x32"] and "nope" in info["failed"]["2x32"]
    assert info["eager_steps"] == 2 and info["buckets"] == [[1, 32]]


class _Replayer:
    """A CPU stand-in for a captured CUDA graph with the same contract: replay() recomputes
    from the static input buffer into the same static output tensor."""

    def __init__(self, step, out) -> None:
        self.step, self.out, self.replays = step, out, 0

    def replay(self) -> None:
        self.out.copy_(self.step())
        self.replays += 1


def test_the_capture_and_replay_path_gives_the_eager_tokens(model64: Llama, monkeypatch) -> None:
    """The CUDA path's bookkeeping, run on the CPU with a graph stand-in: host inputs are
    copied into each bucket's static buffer, replay overwrites one static output, and the
    logits handed back are copies that a later replay does not change."""
    from batching.real.graphs import DecodeGraphs

    def capture(self, step):
        out = step()
        return _Replayer(step, out), out

    monkeypatch.setattr(DecodeGraphs, "_capture", capture)
    w = Workload.from_arrays([0.0, 0.0, 0.0, 0.01, 0.02], [5, 17, 3, 40, 9], [6, 2, 9, 4, 7])
    runs, kept = [], []
    for graphs in (False, True):
        runner = ModelRunner(model64, slots=3, max_len=80, graphs=graphs)
        if graphs:
            runner.graphs.capture = True  # replay through the stand-in
        sch = make_scheduler("continuous", max_context=80, slots=3)
        runs.append(run_real(w, sch, None, runner=runner))
    g = runner.graphs
    # The warm-up captured the buckets the workload reaches: rows 1, 2, 3 x context 64
    # (its longest request holds 44 positions; the slab's 80 is never read).
    assert g.captures == len(g.keys) == 3 and g.keys == [(1, 64), (2, 64), (3, 64)]
    assert sum(x.graph.replays for x in g._graphs.values()) > 0
    assert [r.token_ids for r in runs[0].requests] == [r.token_ids for r in runs[1].requests]
    # Two replays of one bucket: the first step's logits are not overwritten by the second.
    r = admitted(50, 4, 3, slot=0)
    first = StepPlan(prefills=[PrefillChunk(r, 4)])
    commit(first, runner.forward(first), 1.0)
    a = runner.forward(StepPlan(decodes=[r]))
    kept = a.logits[50].clone()
    commit(StepPlan(decodes=[r]), a, 2.0)
    runner.forward(StepPlan(decodes=[r]))
    torch.testing.assert_close(a.logits[50], kept, rtol=0, atol=0)


def test_a_bucket_that_fails_to_capture_runs_eagerly_while_the_others_replay(
    model64: Llama, monkeypatch
) -> None:
    """The capture path's per-bucket bookkeeping through the CPU stand-in: the warm-up
    captures largest first; the first (3 rows x 64) fails as CUDA would (a RuntimeError in
    capture, out of memory), is recorded and skipped, the smaller buckets replay, the run's
    tokens equal the eager run's, and the results file's executor record says it all."""
    from batching.real.graphs import DecodeGraphs

    calls = {"n": 0}

    def capture(self, step):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory")
        out = step()
        return _Replayer(step, out), out

    monkeypatch.setattr(DecodeGraphs, "_capture", capture)
    w = Workload.from_arrays([0.0, 0.0, 0.0, 0.01, 0.02], [5, 17, 3, 40, 9], [6, 2, 9, 4, 7])
    runs = []
    for graphs in (False, True):
        runner = ModelRunner(model64, slots=3, max_len=80, graphs=graphs)
        if graphs:
            runner.graphs.capture = True
        sch = make_scheduler("continuous", max_context=80, slots=3)
        if graphs:
            with pytest.warns(RuntimeWarning, match="3 rows x 64 positions failed: CUDA out of memory"):
                runs.append(run_real(w, sch, None, runner=runner))
        else:
            runs.append(run_real(w, sch, None, runner=runner))
    assert [r.token_ids for r in runs[0].requests] == [r.token_ids for r in runs[1].requests]
    info = runs[1].executor["decode_graphs"]
    assert list(info["failed"]) == ["3x64"] and info["eager_steps"] > 0
    assert info["captured"] == 2 and info["buckets"] == [[1, 64], [2, 64]]
    assert sum(x.graph.replays for x in runner.graphs._graphs.values()) > 0
