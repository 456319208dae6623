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
from batching.real.graphs import batch_bucket, ctx_bucket, gqa_decode_attention
from batching.real.model import Llama, sdpa
from batching.real.runner import ModelRunner, kv_cache_bytes
from batching.schedulers import make_scheduler
from batching.workload import Workload

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
    torch.testing.assert_close(gqa_decode_attention(q, k, v, mask), ref, rtol=0, atol=1e-13)


@pytest.mark.parametrize("rows, bucket", [([(9, 4), (3, 0), (20, 2)], (4, 64)), ([(70, 3)], (1, 128))])
def test_fixed_shape_decode_step_equals_the_eager_step(
    model64: Llama, rows: list[tuple[int, int]], bucket: tuple[int, int]
) -> None:
    """(prompt, slot) rows among 6 slots: 3 rows padded to 4 (every slab read as a view,
    context 64), or 1 row at contexts 70-72 (its slab gathered, context 128). Every row's
    logits equal the eager runner's; padding rows wrote only the scratch slab."""
    eager = ModelRunner(model64, slots=6, max_len=160, graphs=False)
    fixed = ModelRunner(model64, slots=6, max_len=160, graphs=True)
    assert fixed.k_cache.shape[1] == 7 and fixed.kv_bytes == kv_cache_bytes(TINY, 7, 160, F64)
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
    assert fixed.graphs_info() == {"captured": 0, "replayed_as_graphs": False, "buckets": [list(bucket)]}
    assert eager.graphs_info() is None
    # Slabs no request used are still zero; padding rows (if any) wrote the scratch slab.
    for s in set(range(6)) - {s for _, s in rows}:
        assert not fixed.k_cache[:, s].any() and not fixed.v_cache[:, s].any()
    assert bool(fixed.k_cache[:, 6].any()) == (bucket[0] > len(rows))


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
        DecodeGraphs(runner, capture=True)


def test_a_failed_capture_falls_back_to_eager_steps_and_says_why(model64: Llama, monkeypatch) -> None:
    """A bucket that cannot be captured (an op CUDA graphs refuse, out of memory) must not
    lose the run: the step runs eagerly with the same logits, the runner turns graphs off,
    warns, and records the reason for the results file."""
    from batching.real.graphs import DecodeGraphs, GraphCaptureError

    def refuse(self, rows: int, length: int):
        raise GraphCaptureError(
            f"capturing the decode graph of {rows} rows x {length} positions failed: nope"
        )

    eager = ModelRunner(model64, slots=2, max_len=32, graphs=False)
    fixed = ModelRunner(model64, slots=2, max_len=32, graphs=True)
    monkeypatch.setattr(DecodeGraphs, "_make", refuse)
    outs = []
    for runner in (eager, fixed):
        r = admitted(0, 5, 3, slot=1)
        first = StepPlan(prefills=[PrefillChunk(r, 5)])
        commit(first, runner.forward(first), 1.0)
        plan = StepPlan(decodes=[r])
        if runner is fixed:
            with pytest.warns(
                RuntimeWarning, match="1 rows x 32 positions failed: nope; decode steps run eagerly"
            ):
                outs.append(runner.forward(plan))
        else:
            outs.append(runner.forward(plan))
    torch.testing.assert_close(outs[1].logits[0], outs[0].logits[0], rtol=0, atol=1e-11)
    assert fixed.graphs is None and "nope" in fixed.graphs_error
    assert fixed.graphs_info() == {"error": fixed.graphs_error}


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
    assert g.captures == len(g.keys) == 3 * 2  # warm-up captured rows 1, 2, 3 x contexts 64, 80
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
