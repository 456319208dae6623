"""The real engine: everything in the package that imports torch.

:mod:`.model` (the Llama-style model), :mod:`.graphs` (CUDA-graph decode), :mod:`.runner`
(slab KV cache and the step runner), :mod:`.executor` (runs a scheduler's plans on the
model), :mod:`.measure` (step-cost profiles for the simulator) and :mod:`.checkpoint`
(Hugging Face safetensors checkpoints). The torch-free library (:mod:`batching`) never
imports this package at import time; the CLI loads it only for ``run`` and ``measure``.
"""
