"""The CPU decode-attention kernel (``batching.real.attention``): each row read to its own
length in its own slot gives what SDPA gives over that row alone, and the runner's tokens
with it are the cache-free reference's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from batching.real import attention

kernel = attention.decode_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason=f"decode kernel: {attention.decode_kernel_status()}")


def slabs(
    S: int, K: int, L: int, D: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(S, K, L, D, generator=g).to(dtype), torch.randn(S, K, L, D, generator=g).to(dtype))


@needs_kernel
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 2e-2)]
)
@pytest.mark.parametrize(("H", "K"), [(8, 2), (4, 4), (12, 4)])
def test_each_row_attends_to_its_own_slot_and_length(dtype: torch.dtype, tol: float, H: int, K: int) -> None:
    S, L, D = 7, 40, 16
    kc, vc = slabs(S, K, L, D, dtype)
    # Scattered slots, out of order, one twice (a static batch's dead row reads a live slot's
    # slab only in tests), lengths from 1 to the slab's end.
    slots = torch.tensor([5, 0, 3, 6, 0], dtype=torch.long)
    lens = torch.tensor([1, 40, 17, 2, 9], dtype=torch.long)
    q = torch.randn(len(slots), H, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = kernel(q, kc, vc, slots, lens)
    want = attention.decode_reference(q, kc, vc, slots, lens)
    assert got.dtype == dtype and got.shape == q.shape
    assert (got.double() - want.double()).abs().max().item() <= tol


@needs_kernel
def test_positions_past_a_rows_length_are_never_read() -> None:
    kc, vc = slabs(3, 2, 16, 8, torch.float32)
    slots, lens = torch.tensor([1, 2]), torch.tensor([5, 16])
    q = torch.randn(2, 4, 8)
    before = kernel(q, kc, vc, slots, lens)
    kc[1, :, 5:] = float("nan")  # beyond row 0's length, and every other slot
    vc[1, :, 5:] = float("nan")
    kc[0], vc[0] = float("nan"), float("nan")
    assert torch.equal(kernel(q, kc, vc, slots, lens), before)


@needs_kernel
@pytest.mark.parametrize(
    ("slots", "lens", "match"),
    [
        ([3], [1], "slot 3"),
        ([0], [0], "length 0"),
        ([0], [17], "length 17"),
        ([0, 1], [1], "one slot and one length"),
    ],
)
def test_bad_slots_or_lengths_are_refused_before_reading(
    slots: list[int], lens: list[int], match: str
) -> None:
    kc, vc = slabs(3, 2, 16, 8, torch.float32)
    q = torch.randn(len(slots), 4, 8)
    with pytest.raises(RuntimeError, match=match):
        kernel(q, kc, vc, torch.tensor(slots), torch.tensor(lens))


def test_the_runner_falls_back_to_sdpa_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from batching.costs.models import get_model
    from batching.real.runner import ModelRunner

    runner = ModelRunner.from_shape(get_model("tiny"), 2, max_len=16, decode_attention="sdpa")
    assert runner.decode_attention == "sdpa" and runner.decode_kernel is None
    with pytest.raises(ValueError, match="decode_attention='paged'"):
        ModelRunner.from_shape(get_model("tiny"), 2, max_len=16, decode_attention="paged")
    monkeypatch.setattr(attention, "_load", lambda: (None, "not built: no compiler"))
    monkeypatch.setattr("batching.real.runner.decode_kernel", lambda: None)
    monkeypatch.setattr("batching.real.runner.decode_kernel_status", lambda: "not built: no compiler")
    assert ModelRunner.from_shape(get_model("tiny"), 2, max_len=16).decode_attention == "sdpa"
    with pytest.raises(RuntimeError, match="no compiler"):
        ModelRunner.from_shape(get_model("tiny"), 2, max_len=16, decode_attention="kernel")
