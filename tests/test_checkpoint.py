"""Hugging Face checkpoints of the engine's model: round trip, refusals, and agreement with
transformers on the same weights (the peer benchmark's premise: identical weights give
identical greedy tokens)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from batching.cli import main
from batching.costs.models import get_model
from batching.real.checkpoint import (
    WEIGHTS_FILE,
    CheckpointError,
    load_hf_checkpoint,
    read_config,
    save_hf_checkpoint,
)
from batching.real.executor import run_real
from batching.real.model import Llama, ModelConfig
from batching.real.runner import prompt_ids
from batching.request import Request
from batching.schedulers import ContinuousScheduler

pytestmark = pytest.mark.model
TINY = ModelConfig.from_shape(get_model("tiny"))
UNTIED = replace(TINY, name="tiny-untied", tied_embeddings=False)


def params(m: Llama) -> dict[str, torch.Tensor]:
    return dict(m.named_parameters(remove_duplicate=False))


@pytest.mark.parametrize("cfg", [TINY, UNTIED], ids=["tied", "untied"])
def test_round_trip_is_bit_identical(tmp_path, cfg: ModelConfig) -> None:
    m = Llama(cfg, "cpu", torch.float32, seed=3)
    save_hf_checkpoint(m, tmp_path)
    assert read_config(tmp_path) == cfg
    back = load_hf_checkpoint(tmp_path, "cpu", torch.float32)
    assert back.cfg == cfg and back.dtype == torch.float32
    a, b = params(m), params(back)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ids = torch.tensor(prompt_ids(0, 7, 12, cfg.vocab))
    assert torch.equal(m.forward_full(ids), back.forward_full(ids))
    if not cfg.tied_embeddings:  # the head is its own matrix, not the embedding
        assert not torch.equal(back.lm_head, back.embed)


def test_checkpoint_names_and_config(tmp_path) -> None:
    m = Llama(TINY, "cpu", torch.float32, seed=0)
    save_hf_checkpoint(m, tmp_path)
    names = set(st.load_file(str(tmp_path / WEIGHTS_FILE)))
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied
    assert {
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.norm.weight",
    } <= names
    hf = json.loads((tmp_path / "config.json").read_text())
    assert (
        hf["hidden_size"],
        hf["intermediate_size"],
        hf["num_attention_heads"],
        hf["num_key_value_heads"],
        hf["num_hidden_layers"],
        hf["vocab_size"],
        hf["head_dim"],
    ) == (64, 176, 4, 2, 2, 256, 16)
    assert hf["tie_word_embeddings"] is True and hf["attention_bias"] is False and hf["mlp_bias"] is False
    assert hf["rope_theta"] == 10_000.0 and hf["rms_norm_eps"] == 1e-5 and hf["torch_dtype"] == "float32"


def _edit(path, fn) -> None:
    f = path / WEIGHTS_FILE
    t = st.load_file(str(f))
    fn(t)
    st.save_file(t, str(f), metadata={"format": "pt"})


def test_unknown_missing_and_misshapen_tensors_are_named(tmp_path) -> None:
    save_hf_checkpoint(Llama(TINY, "cpu", torch.float32), tmp_path)
    _edit(tmp_path, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}))
    with pytest.raises(CheckpointError, match=r"unknown tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'"):
        load_hf_checkpoint(tmp_path)
    _edit(
        tmp_path,
        lambda t: (t.pop("model.layers.0.self_attn.q_proj.bias"), t.pop("model.layers.1.mlp.up_proj.weight")),
    )
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_hf_checkpoint(tmp_path)
    _edit(tmp_path, lambda t: t.update({"model.layers.1.mlp.up_proj.weight": torch.zeros(175, 64)}))
    with pytest.raises(
        CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' has shape \[175, 64\]"
    ):
        load_hf_checkpoint(tmp_path)


def test_unsupported_configs_are_refused(tmp_path) -> None:
    save_hf_checkpoint(Llama(TINY, "cpu", torch.float32), tmp_path)
    f = tmp_path / "config.json"
    base = json.loads(f.read_text())
    for change, msg in [
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"head_dim": 32}, "head_dim=32"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "rope_type='llama3'"),
    ]:
        f.write_text(json.dumps({**base, **change}))
        with pytest.raises(CheckpointError, match=msg):
            load_hf_checkpoint(tmp_path)


def test_missing_safetensors_names_the_bench_extra(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match="bench"):
        save_hf_checkpoint(Llama(TINY, "cpu", torch.float32), tmp_path)


def test_run_real_and_cli_load_a_checkpoint(tmp_path, capsys) -> None:
    m = Llama(TINY, "cpu", torch.float32, seed=5)
    save_hf_checkpoint(m, tmp_path / "ck")
    reqs = [Request(i, 0.0, 5 + 2 * i, 3 + i) for i in range(3)]
    res = run_real(
        reqs, ContinuousScheduler(2, 64), None, device="cpu", seed=1, max_len=64, checkpoint=tmp_path / "ck"
    )
    for r in res.requests:  # the checkpoint's weights, not the seed-0 random ones
        assert r.token_ids == m.generate_full(prompt_ids(1, r.rid, r.prompt_len, TINY.vocab), r.output_len)
    with pytest.raises(ValueError, match="holds 'tiny'"):
        run_real(reqs, ContinuousScheduler(2, 64), "cpu-s", device="cpu", checkpoint=tmp_path / "ck")
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "run",
                "--preset",
                "chat-rag",
                "-n",
                "3",
                "--scale-lengths",
                "40",
                "--cap",
                "--scheduler",
                "continuous",
                "--slots",
                "2",
                "--device",
                "cpu",
                "--checkpoint",
                str(tmp_path / "ck"),
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["config"]["model"] == "tiny" and doc["config"]["checkpoint"] == str(tmp_path / "ck")


# ------------------------------------------------------------------ against transformers
@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """The same float64 weights in both engines."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("ck64")
    ours = Llama(TINY, "cpu", torch.float64, seed=0)
    save_hf_checkpoint(ours, path)
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    return path, ours, hf


def test_logits_match_transformers(hf_pair) -> None:
    _, ours, hf = hf_pair
    ids = torch.tensor(prompt_ids(0, 1, 40, TINY.vocab))
    with torch.no_grad():
        theirs = hf(ids[None]).logits[0]
    mine = ours.forward_full(ids)
    # transformers computes RoPE angles and RMSNorm in fp32 even for a float64 model.
    rel = ((mine - theirs).abs().max() / theirs.abs().max()).item()
    assert rel < 1e-5, rel


def test_greedy_tokens_equal_transformers_generate(hf_pair) -> None:
    path, _, hf = hf_pair
    reqs = [Request(i, 0.0, p, o) for i, (p, o) in enumerate([(9, 12), (30, 5), (3, 20), (17, 16)])]
    res = run_real(
        reqs,
        ContinuousScheduler(3, 64),
        "tiny",
        device="cpu",
        dtype="fp64",
        seed=2,
        max_len=64,
        checkpoint=path,
    )
    for r in res.requests:
        ids = torch.tensor([prompt_ids(2, r.rid, r.prompt_len, TINY.vocab)])
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=r.output_len,
                min_new_tokens=r.output_len,
                do_sample=False,
                pad_token_id=0,
            )
        assert r.token_ids == out[0, r.prompt_len :].tolist(), r.rid
