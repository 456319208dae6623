"""Hugging Face ``LlamaForCausalLM`` checkpoints of this engine's model (the peer benchmark).

:func:`save_hf_checkpoint` writes a :class:`~batching.model.Llama` as a directory that
``transformers.LlamaForCausalLM.from_pretrained`` loads (``config.json`` plus
``model.safetensors``); :func:`load_hf_checkpoint` reads such a directory back into a
:class:`~batching.model.Llama`. The same weights then run through both engines, so their
speed can be compared and their greedy tokens must agree (``benchmarks/bench_peer.py``).

Only the layout differs between the two: this engine keeps q, k, v in one matrix
(``wqkv``, rows q then k then v) and gate, up in another (``w_gate_up``), Hugging Face keeps
one matrix each. Both apply RoPE in the rotate-half convention to q and k laid out as
``[heads, head_dim]``, so no row permutation is needed (``tests/test_checkpoint.py`` checks
logits against transformers).

Importing this module needs torch only; ``safetensors`` is imported when a function runs
(the ``bench`` extra: ``pip install -e .[bench]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .model import Llama, ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint this engine cannot load (missing or unknown tensors, unsupported config)."""


def _safetensors_torch() -> Any:
    try:
        import safetensors.torch as st
    except ImportError:
        raise ImportError(
            "Hugging Face checkpoints need the `safetensors` package: install the `bench` "
            "extra (pip install -e '.[bench]')"
        ) from None
    return st


def hf_config(model: Llama) -> dict[str, Any]:
    """The ``config.json`` of ``model`` as a Hugging Face ``LlamaConfig`` (peer benchmark).

    EOS, BOS and padding ids are null: the random model has no tokenizer, and runs stop at
    each request's length (EOS disabled, as vLLM's benchmark does). ``batching_model`` records
    the registry shape's name, which transformers keeps as an extra attribute.
    """
    cfg = model.cfg
    dtype = str(model.dtype).removeprefix("torch.")  # float32, bfloat16, ...
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "num_hidden_layers": cfg.layers,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab,
        "max_position_embeddings": cfg.max_context,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "torch_dtype": dtype,
        "dtype": dtype,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "use_cache": True,
        "batching_model": cfg.name,
    }


def _hf_layout(model: Llama) -> list[tuple[Tensor, dict[str, int]]]:
    """Each of ``model``'s tensors with the Hugging Face tensors stacked in it, top to bottom,
    and their rows (``wqkv`` is q, k, v; ``w_gate_up`` is gate, up): the one naming table
    that saving, loading and a load's checks share."""
    cfg = model.cfg
    q, kv, d, f = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.hidden, cfg.ffn
    out: list[tuple[Tensor, dict[str, int]]] = [
        (model.embed, {"model.embed_tokens.weight": cfg.vocab}),
        (model.norm, {"model.norm.weight": d}),
    ]
    for i, b in enumerate(model.layers):
        p = f"model.layers.{i}."
        out += [
            (b.wqkv, {p + f"self_attn.{x}_proj.weight": n for x, n in zip("qkv", (q, kv, kv))}),
            (b.wo, {p + "self_attn.o_proj.weight": d}),
            (b.w_gate_up, {p + "mlp.gate_proj.weight": f, p + "mlp.up_proj.weight": f}),
            (b.w_down, {p + "mlp.down_proj.weight": d}),
            (b.attn_norm, {p + "input_layernorm.weight": d}),
            (b.mlp_norm, {p + "post_attention_layernorm.weight": d}),
        ]
    if not cfg.tied_embeddings:
        out.append((model.lm_head, {"lm_head.weight": cfg.vocab}))
    return out


def hf_state_dict(model: Llama) -> dict[str, Tensor]:
    """``model``'s weights under Hugging Face Llama names (q/k/v and gate/up split apart),
    each a contiguous tensor of its own (safetensors refuses tensors sharing memory)."""
    return {
        name: piece.detach().to("cpu").clone().contiguous()
        for t, parts in _hf_layout(model)
        for name, piece in zip(parts, t.split(list(parts.values())))
    }


def save_hf_checkpoint(model: Llama, path: str | Path) -> Path:
    """Write ``model`` as a Hugging Face ``LlamaForCausalLM`` directory (``config.json``,
    ``model.safetensors``) in its own dtype; returns the directory."""
    st = _safetensors_torch()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    st.save_file(hf_state_dict(model), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(hf_config(model), indent=2) + "\n")
    return out


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckpointError(msg)


def config_from_hf(hf: dict[str, Any], name: str | None = None) -> ModelConfig:
    """The :class:`~batching.model.ModelConfig` of a Hugging Face Llama ``config.json``.

    Refuses what this engine's model does not implement (biases, another activation, a
    head_dim other than hidden / heads, RoPE scaling). ``name`` defaults to the config's
    ``batching_model`` (written by :func:`save_hf_checkpoint`), else ``"hf-llama"``.
    """
    _require(
        hf.get("model_type", "llama") == "llama", f"model_type={hf.get('model_type')!r}: only 'llama' loads"
    )
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        _require(key in hf, f"config.json has no {key!r}")
    hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    _require(hidden % heads == 0, f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
    head_dim = hf.get("head_dim")
    _require(
        head_dim in (None, hidden // heads),
        f"head_dim={head_dim} != hidden_size / num_attention_heads = {hidden // heads}: not supported",
    )
    _require(not hf.get("attention_bias", False), "attention_bias=true: this engine's model has no biases")
    _require(not hf.get("mlp_bias", False), "mlp_bias=true: this engine's model has no biases")
    _require(
        hf.get("hidden_act", "silu") == "silu", f"hidden_act={hf.get('hidden_act')!r}: only 'silu' (SwiGLU)"
    )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    _require(rope_type == "default", f"rope_type={rope_type!r}: only plain RoPE ('default') is implemented")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
    dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    bytes_per = 2 if dtype in ("bfloat16", "float16") else 4  # the registry knows 1, 2 and 4 bytes
    return ModelConfig(
        name=name or hf.get("batching_model") or "hf-llama",
        layers=int(hf["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=int(hf["intermediate_size"]),
        vocab=int(hf["vocab_size"]),
        max_context=int(hf.get("max_position_embeddings", 2048)),
        bytes_per_param=bytes_per,
        kv_bytes=bytes_per,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope_theta=float(theta),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    )


def read_config(path: str | Path) -> ModelConfig:
    """The model config of a checkpoint directory, without reading its weights."""
    f = Path(path) / CONFIG_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f}: no config.json (not a Hugging Face checkpoint directory)")
    return config_from_hf(json.loads(f.read_text()))


@torch.no_grad()
def load_hf_checkpoint(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    wx: bool | None = None,
) -> Llama:
    """A :class:`~batching.model.Llama` holding the weights of a Hugging Face Llama checkpoint
    directory (one ``model.safetensors``; sharded checkpoints are not supported).

    ``dtype`` defaults to the model's default for ``device`` (fp32 on CPU, bf16 on CUDA);
    weights are cast to it. A tensor the model has no place for, or a missing one, raises
    :class:`CheckpointError` naming it; so does a tensor of the wrong shape.
    """
    st = _safetensors_torch()
    cfg = read_config(path)
    f = Path(path) / WEIGHTS_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f}: no model.safetensors (sharded checkpoints are not supported)")
    tensors = st.load_file(str(f))
    if cfg.tied_embeddings:
        # Some writers store the tied head anyway: accept it only if it is the embedding.
        head = tensors.pop("lm_head.weight", None)
        if head is not None and not torch.equal(head, tensors.get("model.embed_tokens.weight", head)):
            raise CheckpointError(
                "lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true"
            )
    model = Llama(cfg, device, dtype, seed=0, wx=wx)  # random init, overwritten below
    layout = _hf_layout(model)
    want = {name: (rows, *t.shape[1:]) for t, parts in layout for name, rows in parts.items()}
    for what, names in (("unknown", set(tensors) - set(want)), ("missing", set(want) - set(tensors))):
        if names:
            first, *more = sorted(names)
            raise CheckpointError(
                f"{f}: {what} tensor {first!r}" + (f" (and {len(more)} more)" if more else "")
            )
    for k, shape in want.items():
        if tuple(tensors[k].shape) != shape:
            raise CheckpointError(
                f"{f}: tensor {k!r} has shape {list(tensors[k].shape)}, expected {list(shape)}"
            )
    for t, parts in layout:
        t.copy_(torch.cat([tensors[name] for name in parts]).to(device=t.device, dtype=t.dtype))
    return model
