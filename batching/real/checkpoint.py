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

_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",
}
_NAME_DTYPES: dict[str, torch.dtype] = {v: k for k, v in _DTYPE_NAMES.items()}


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
    dtype = _DTYPE_NAMES[model.dtype]
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


def hf_state_dict(model: Llama) -> dict[str, Tensor]:
    """``model``'s weights under Hugging Face Llama names (q/k/v and gate/up split apart),
    each a contiguous tensor of its own (safetensors refuses tensors sharing memory)."""
    cfg = model.cfg
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    out: dict[str, Tensor] = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm}
    for i, b in enumerate(model.layers):
        p = f"model.layers.{i}."
        wq, wk, wv = b.wqkv.split([q, kv, kv], dim=0)
        gate, up = b.w_gate_up.split([cfg.ffn, cfg.ffn], dim=0)
        out.update(
            {
                p + "self_attn.q_proj.weight": wq,
                p + "self_attn.k_proj.weight": wk,
                p + "self_attn.v_proj.weight": wv,
                p + "self_attn.o_proj.weight": b.wo,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": b.w_down,
                p + "input_layernorm.weight": b.attn_norm,
                p + "post_attention_layernorm.weight": b.mlp_norm,
            }
        )
    if not cfg.tied_embeddings:
        out["lm_head.weight"] = model.lm_head
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in out.items()}


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
    dtype = _NAME_DTYPES.get(str(hf.get("dtype") or hf.get("torch_dtype") or "float32"), torch.float32)
    bytes_per = {torch.bfloat16: 2, torch.float16: 2}.get(dtype, 4)  # the registry knows 1, 2 and 4 bytes
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
    want = hf_state_dict_shapes(cfg)
    unknown = sorted(set(tensors) - set(want))
    missing = sorted(set(want) - set(tensors))
    if unknown:
        raise CheckpointError(
            f"{f}: unknown tensor {unknown[0]!r}"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
        )
    if missing:
        raise CheckpointError(
            f"{f}: missing tensor {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    for k, shape in want.items():
        if tuple(tensors[k].shape) != shape:
            raise CheckpointError(
                f"{f}: tensor {k!r} has shape {list(tensors[k].shape)}, expected {list(shape)}"
            )

    def put(dst: Tensor, *names: str) -> None:
        src = tensors[names[0]] if len(names) == 1 else torch.cat([tensors[n] for n in names], dim=0)
        dst.copy_(src.to(device=dst.device, dtype=dst.dtype))

    put(model.embed, "model.embed_tokens.weight")
    put(model.norm, "model.norm.weight")
    for i, b in enumerate(model.layers):
        p = f"model.layers.{i}."
        put(b.wqkv, *(p + f"self_attn.{x}_proj.weight" for x in "qkv"))
        put(b.wo, p + "self_attn.o_proj.weight")
        put(b.w_gate_up, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        put(b.w_down, p + "mlp.down_proj.weight")
        put(b.attn_norm, p + "input_layernorm.weight")
        put(b.mlp_norm, p + "post_attention_layernorm.weight")
    if not cfg.tied_embeddings:
        put(model.lm_head, "lm_head.weight")
    return model


def hf_state_dict_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name a Hugging Face checkpoint of ``cfg`` holds, with its shape."""
    d, hd = cfg.hidden, cfg.head_dim
    q, kv = cfg.heads * hd, cfg.kv_heads * hd
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab, d), "model.norm.weight": (d,)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "self_attn.q_proj.weight": (q, d),
                p + "self_attn.k_proj.weight": (kv, d),
                p + "self_attn.v_proj.weight": (kv, d),
                p + "self_attn.o_proj.weight": (d, q),
                p + "mlp.gate_proj.weight": (cfg.ffn, d),
                p + "mlp.up_proj.weight": (cfg.ffn, d),
                p + "mlp.down_proj.weight": (d, cfg.ffn),
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
            }
        )
    if not cfg.tied_embeddings:
        out["lm_head.weight"] = (cfg.vocab, d)
    return out
