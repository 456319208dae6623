"""The torch model and its runner: cached, packed steps equal a cache-free forward pass."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from batching.costs.models import MODELS, get_model
from batching.plan import PrefillChunk, StepPlan
from batching.real.attention import decode_kernel, decode_kernel_status
from batching.real.hardware import DeviceMemoryError
from batching.real.model import Llama, ModelConfig
from batching.real.runner import ModelRunner, StepOutput, kv_cache_bytes, prompt_ids
from batching.request import Request

pytestmark = pytest.mark.model
F64 = torch.float64
TINY = ModelConfig.from_shape(get_model("tiny"))


#: Tests of the CPU decode kernel run where it builds (a compiler and ninja).
needs_decode_kernel = pytest.mark.skipif(
    decode_kernel() is None, reason=f"decode kernel: {decode_kernel_status()}"
)


def commit(plan: StepPlan, out: StepOutput, t: float) -> None:
    """What the engine's scheduler.commit does to the requests, without a scheduler."""
    for c in plan.prefills:
        c.req.on_prefill(c.n, c.pad)
        if c.completes:
            c.req.on_token(t, out.token_ids[c.req.rid])
    for r in plan.decodes:
        r.on_decode()
        r.on_token(t, out.token_ids[r.rid])


def decodes_equal_the_reference(
    runner: ModelRunner, model: Llama, reqs: list[Request], steps: int = 2
) -> None:
    """``steps`` decode steps of ``reqs``: every row's logits equal its own cache-free pass."""
    for _ in range(steps):
        plan = StepPlan(decodes=reqs)
        out = runner.forward(plan)
        commit(plan, out, 2.0)
        for r in reqs:
            ids = runner.tokens(r)
            ref = model.forward_full(torch.tensor(ids))
            torch.testing.assert_close(out.logits[r.rid], ref[len(ids) - 2], rtol=0, atol=1e-11)


def admitted(rid: int, prompt: int, output: int, slot: int) -> Request:
    r = Request(rid, 0.0, prompt, output)
    r.on_admit(slot, 0.0)
    return r


def test_config_matches_the_registry_parameter_count() -> None:
    for shape in MODELS.values():
        assert ModelConfig.from_shape(shape).params == shape.params, shape.name
    assert Llama(TINY, "cpu", torch.float32).num_params() == get_model("tiny").params
    assert ModelConfig.from_shape(get_model("llama-8b")).rope_theta == 500_000.0


def test_random_weights_give_varied_context_dependent_greedy_tokens(model64: Llama) -> None:
    outs = [model64.generate_full(prompt_ids(0, rid, 8, TINY.vocab), 12) for rid in range(3)]
    for out in outs:
        assert len(set(out)) >= 4, out  # not one token repeated forever
    assert len({tuple(o) for o in outs}) == 3  # different prompts, different continuations


def test_chunked_prefill_and_decodes_equal_the_full_forward_pass(model64: Llama) -> None:
    """7.3: chunks of 3 + 5 + 2 prompt tokens, then decodes, in slot 2 of 4: every emitted
    logits row equals the cache-free forward pass over the same ids."""
    runner = ModelRunner(model64, slots=4, max_len=32)
    r = admitted(7, 10, 6, slot=2)
    emitted: list[torch.Tensor] = []
    for n in (3, 5, 2):
        plan = StepPlan(prefills=[PrefillChunk(r, n)])
        out = runner.forward(plan)
        assert (r.rid in out.token_ids) == (n == 2)  # only the completing chunk emits
        commit(plan, out, 1.0)
    emitted.append(out.logits[r.rid])
    while not r.done:
        plan = StepPlan(decodes=[r])
        out = runner.forward(plan)
        emitted.append(out.logits[r.rid])
        commit(plan, out, 1.0)
    ids = runner.tokens(r)
    assert ids[:10] == prompt_ids(0, 7, 10, TINY.vocab) and ids[10:] == r.token_ids
    ref = model64.forward_full(torch.tensor(ids))  # [16, V]
    got = torch.stack(emitted)  # logits of positions 9..14
    torch.testing.assert_close(got, ref[9:15], rtol=0, atol=1e-11)
    assert r.token_ids == ref[9:15].argmax(-1).tolist()


def test_mixed_step_packs_decodes_chunks_and_padding_without_crosstalk(model64: Llama) -> None:
    """7.1/7.2 in one pass: a decode row, a padded chunk and a chunk after cached context,
    in shuffled slots; each request's logits equal its own cache-free pass."""
    runner = ModelRunner(model64, slots=3, max_len=40)
    a, b, c = admitted(0, 6, 3, slot=2), admitted(1, 9, 2, slot=0), admitted(2, 4, 2, slot=1)
    first = StepPlan(prefills=[PrefillChunk(a, 6), PrefillChunk(b, 4)])
    commit(first, runner.forward(first), 1.0)
    # a decodes; b finishes its prompt (5 more after 4 cached); c's prompt padded by 7.
    plan = StepPlan(prefills=[PrefillChunk(b, 5), PrefillChunk(c, 4, pad=7)], decodes=[a])
    out = runner.forward(plan)
    assert set(out.token_ids) == {0, 1, 2}
    commit(plan, out, 2.0)
    for r in (a, b, c):
        ids = runner.tokens(r)
        ref = model64.forward_full(torch.tensor(ids))
        torch.testing.assert_close(out.logits[r.rid], ref[len(ids) - 2], rtol=0, atol=1e-11)


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("kernel", marks=needs_decode_kernel)])
@pytest.mark.parametrize("slots, how", [((0, 2, 3), "holes"), ((0, 5), "gather"), ((1, 2, 3), "range")])
def test_decode_rows_in_scattered_slots_read_only_their_own_slabs(
    model64: Llama, slots: tuple[int, ...], how: str, attention: str
) -> None:
    """7.2: decode rows whose slots leave holes (SDPA: read as one view, holes included), lie
    wide apart (gathered) or form a range: each row's logits equal its own cache-free pass,
    and the hole slabs' contents (another request's stale K/V) change nothing, through SDPA
    and through the decode kernel (every slot in place)."""
    runner = ModelRunner(model64, slots=6, max_len=32, decode_attention=attention)
    reqs = [admitted(i, 4 + 3 * i, 4, slot=s) for i, s in enumerate(slots)]
    stale = admitted(99, 11, 1, slot={"holes": 1, "gather": 3, "range": 0}[how])  # a slab the batch skips
    first = StepPlan(prefills=[PrefillChunk(r, r.prompt_len) for r in reqs + [stale]])
    commit(first, runner.forward(first), 1.0)
    idx = runner._decode_index(list(slots), [r.num_computed for r in reqs])
    assert {
        "holes": isinstance(idx.sel, slice) and idx.place is not None,
        "gather": isinstance(idx.sel, torch.Tensor),
        "range": isinstance(idx.sel, slice) and idx.place is None,
    }[how]
    decodes_equal_the_reference(runner, model64, reqs)


def test_short_and_long_decode_rows_split_into_two_groups_give_the_reference_logits(monkeypatch) -> None:
    """Rows of very different contexts are read as two groups, each to its own longest context
    (split_by_length), the short group through holes; every row's logits still equal its own
    cache-free pass, in the rows' order."""
    from batching.real import runner as R

    model = Llama(TINY, "cpu", F64, seed=0)
    monkeypatch.setattr(R, "GROUP_COST_POSITIONS", 4)  # tiny contexts: a split must pay off
    lens = {0: 3, 1: 40, 2: 4, 3: 5, 4: 3, 5: 44}  # slot: prompt length
    assert R.split_by_length(list(lens), [n - 1 for n in lens.values()]) == ([0, 2, 3, 4], [1, 5])
    assert R.split_by_length([0, 1, 2, 3], [10, 10, 11, 10]) is None  # alike: one group
    runner = ModelRunner(model, slots=6, max_len=64, decode_attention="sdpa")
    reqs = [admitted(s, n, 3, slot=s) for s, n in lens.items()]
    first = StepPlan(prefills=[PrefillChunk(r, r.prompt_len) for r in reqs])
    commit(first, runner.forward(first), 1.0)
    assert isinstance(runner._decode_groups(list(lens), [r.num_computed for r in reqs]), list)
    decodes_equal_the_reference(runner, model, reqs)


def test_padded_plan_equals_the_unpadded_product() -> None:
    """A plan that runs a step's rows padded to a bucket (and some buckets on other paths)
    gives the plain product on the real rows, and lists the row counts steps run on."""
    from batching.real.kernels import Bucket, LinearPlan

    plan = LinearPlan(
        "fp64", (Bucket(1, "aten", 2), Bucket(4, "wx", 4), Bucket(16, "aten", 24), Bucket(24, "wx", 0))
    )
    m = Llama(TINY, "cpu", F64, seed=0, kernels=plan)
    assert [plan.lookup(t) for t in (1, 2, 3, 5, 17, 30)] == [
        ("aten", 2),
        ("wx", 4),
        ("wx", 4),
        ("aten", 24),
        ("wx", 17),
        ("wx", 30),
    ]
    assert plan.token_buckets() == [4, *range(17, 25)]  # 17-24 run as themselves
    w = m.blocks[0].w_gate_up
    for T in (1, 3, 7, 13, 20, 100):
        x = torch.randn(T, TINY.hidden, dtype=F64, generator=torch.Generator().manual_seed(T))
        torch.testing.assert_close(m.linear(x, w), x @ w.T, rtol=0, atol=1e-12)
    assert LinearPlan.fixed("aten").token_buckets() is None


def test_kv_slab_that_does_not_fit_is_refused_with_both_numbers(model64: Llama) -> None:
    need = kv_cache_bytes(TINY, 8, 512, F64)
    assert need == 2 * 2 * 8 * 2 * 512 * 16 * 8
    with pytest.raises(DeviceMemoryError, match=r"needed=.*available=1,000,000 bytes"):
        ModelRunner(model64, slots=8, mem_available=1_000_000)
    with pytest.raises(DeviceMemoryError, match="needed.*available"):  # the machine's real free memory
        ModelRunner(model64, slots=10**7)
    # Weights are checked before they are allocated: 8B in fp32 is 32 GB.
    with pytest.raises(DeviceMemoryError, match="llama-8b.*needed.*available"):
        ModelRunner.from_shape(get_model("llama-8b"), 1, mem_available=8 * 10**9)


def test_token_ids_are_the_requests_own(model64: Llama) -> None:
    """Token ids are stored once: the prompt comes from the seed, generated ids from the
    request. A request committed without its ids (a simulated run's) is refused, saying so."""
    runner = ModelRunner(model64, slots=1, max_len=16)
    r = admitted(3, 4, 3, slot=0)
    plan = StepPlan(prefills=[PrefillChunk(r, 4)])
    commit(plan, runner.forward(plan), 1.0)
    assert runner.tokens(r) == prompt_ids(0, 3, 4, TINY.vocab) + r.token_ids and len(r.token_ids) == 1
    assert not hasattr(runner, "history")
    lost = admitted(4, 4, 3, slot=0)
    lost.on_prefill(4)
    lost.on_token(1.0)  # no id recorded
    with pytest.raises(RuntimeError, match="request 4: 1 tokens generated but 0 of their ids recorded"):
        runner.forward(StepPlan(decodes=[lost]))


def test_plan_beyond_the_slab_is_refused(model64: Llama) -> None:
    runner = ModelRunner(model64, slots=1, max_len=8)
    with pytest.raises(RuntimeError, match="max_len 8"):
        runner.forward(StepPlan(prefills=[PrefillChunk(admitted(0, 9, 1, slot=0), 9)]))
    with pytest.raises(ValueError, match="max_len"):
        ModelRunner(model64, slots=1, max_len=TINY.max_context + 1)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_batch1_split_products_give_the_plain_layouts_logits(threads: int) -> None:
    """The one-row ``split`` path multiplies transposed copies of every weight, the input
    dimension split one piece per thread; the numbers must be those of ``F.linear`` whatever
    the thread count (3 does not divide tiny's widths: fewer pieces), and its copies are
    counted."""
    from batching.real.kernels import LinearPlan
    from batching.real.model import form_copy_params

    m = Llama(TINY, "cpu", F64, seed=0, kernels=LinearPlan.fixed("split", "fp64"))
    plain = Llama(TINY, "cpu", F64, seed=0, kernels=LinearPlan.fixed("aten", "fp64"))
    ids = torch.tensor([5])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for pos in (0, 7):
            noop = lambda layer, q, k, v: q[:, : TINY.heads]
            got = m(ids, torch.tensor([pos]), noop)
            ref = plain(ids, torch.tensor([pos]), noop)
            assert got.shape == (1, TINY.vocab)
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    finally:
        torch.set_num_threads(before)
    assert len(m._forms) == 4 * TINY.layers + 1  # qkv, o, gate/up, down of each layer, the lm head
    assert m.forms_bytes() == form_copy_params(TINY) * 8 == sum(w.numel() for w in m.linear_weights()) * 8
    assert plain.forms_bytes() == 0


def test_split_ways_is_one_piece_per_thread_that_divides_the_width() -> None:
    from batching.real.kernels import split_ways

    assert [split_ways(768, t) for t in (0, 1, 2, 4, 5, 16)] == [1, 1, 2, 4, 4, 16]
    assert split_ways(7, 4) == 1 and split_ways(9, 4) == 3


def test_weight_forms_follow_weights_changed_in_place() -> None:
    """A checkpoint copied into the parameters after construction must not leave stale copies."""
    from batching.real.kernels import LinearPlan

    m = Llama(TINY, "cpu", F64, seed=0, kernels=LinearPlan.fixed("split", "fp64"))
    plain = Llama(TINY, "cpu", F64, seed=1, kernels=LinearPlan.fixed("aten", "fp64"))
    with torch.no_grad():
        for a, b in zip(m.parameters(), plain.parameters()):
            a.copy_(b)
    noop = lambda layer, q, k, v: q
    ids, pos = torch.tensor([3]), torch.tensor([2])
    torch.testing.assert_close(m(ids, pos, noop), plain(ids, pos, noop), rtol=1e-12, atol=1e-12)
