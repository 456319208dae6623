"""Hugging Face ``LlamaForCausalLM`` checkpoints (``config.json``, ``model.safetensors``) of
:class:`~batching.real.model.Llama`, both ways, so both engines run the same weights.

Only the layout differs (q, k, v stacked in ``wqkv``, gate and up in ``w_gate_up``); both
rotate-half ``[heads, head_dim]``, so no row permutation. Needs ``safetensors`` (``bench``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .model import Llama, ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

#: The end-of-sequence id of :func:`save_hf_tokenizer`: inside the vocabulary, since a server
#: may index the logits at it (vLLM's ``min_tokens`` masks its logit: an id of ``vocab`` is an
#: IndexError that kills its engine), and in no prompt: ``runner.prompt_ids`` draws
#: ``1..vocab-1`` (0 is also the padding id). Runs stop at each request's length
#: (``ignore_eos``); greedy decoding may emit 0 as an ordinary token.
EOS_ID = 0
EOS_TOKEN = "<eos>"


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
    """The ``config.json`` of ``model``: no EOS, BOS or padding ids (runs stop at each request's
    length; :func:`save_hf_tokenizer` names EOS for servers that need one); ``batching_model``:
    the registry shape's name."""
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
    """Each of ``model``'s tensors with the Hugging Face tensors stacked in it and their rows."""
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


def save_hf_checkpoint(model: Llama, path: str | Path) -> Path:
    """Write ``model`` as a checkpoint directory in its own dtype; returns the directory."""
    st = _safetensors_torch()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # Each tensor a copy of its own: safetensors refuses tensors sharing memory.
    weights = {
        name: piece.detach().to("cpu").clone().contiguous()
        for t, parts in _hf_layout(model)
        for name, piece in zip(parts, t.split(list(parts.values())))
    }
    st.save_file(weights, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(hf_config(model), indent=2) + "\n")
    return out


def save_hf_tokenizer(path: str | Path, vocab: int) -> Path:
    """Write a word-level tokenizer of ``vocab`` ids beside a checkpoint: id ``i`` is the word
    ``t{i}`` (a prompt of N ids is N words, no BOS) and EOS (``<eos>``) is :data:`EOS_ID`; every
    id is one of the model's logits. Needs ``transformers`` (``bench``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    # Importing transformers imports huggingface_hub, which imports tqdm.auto: in a Jupyter
    # kernel without ipywidgets that warns "IProgress not found" (once per process), about a
    # progress bar that nothing here shows.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    del words[f"t{EOS_ID}"]
    words[EOS_TOKEN] = EOS_ID
    tok = Tokenizer(models.WordLevel(words, unk_token=EOS_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = Path(path)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN).save_pretrained(str(out))
    return out


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckpointError(msg)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """The model config of a Llama ``config.json`` (named ``batching_model``, else ``hf-llama``);
    refuses biases, another activation, head_dim != hidden / heads and RoPE scaling."""
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
    for bias in ("attention_bias", "mlp_bias"):
        _require(not hf.get(bias, False), f"{bias}=true: this engine's model has no biases")
    _require(
        hf.get("hidden_act", "silu") == "silu", f"hidden_act={hf.get('hidden_act')!r}: only 'silu' (SwiGLU)"
    )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    _require(rope_type == "default", f"rope_type={rope_type!r}: only plain RoPE ('default') is implemented")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
    dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    bytes_per = 2 if dtype in ("bfloat16", "float16") else 4
    return ModelConfig(
        name=hf.get("batching_model") or "hf-llama",
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
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> Llama:
    """A :class:`~batching.real.model.Llama` of a checkpoint's (unsharded) weights in ``dtype``
    (default: fp32 on CPU, bf16 on CUDA); a bad tensor raises :class:`CheckpointError` naming it."""
    st = _safetensors_torch()
    cfg = read_config(path)
    f = Path(path) / WEIGHTS_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f}: no model.safetensors (sharded checkpoints are not supported)")
    tensors = st.load_file(str(f))
    if cfg.tied_embeddings:
        # Some writers store a tied head anyway: accepted if it is the embedding.
        head = tensors.pop("lm_head.weight", None)
        if head is not None and not torch.equal(head, tensors.get("model.embed_tokens.weight", head)):
            raise CheckpointError(
                "lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings is true"
            )
    model = Llama(cfg, device, dtype, seed=0)  # overwritten below
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
