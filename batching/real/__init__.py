"""The real engine: everything in the package that imports torch.

:mod:`.hardware` (which device, its registry entry, its free memory), :mod:`.model` (the
Llama-style model and its attention kernels), :mod:`.cache` (the slab KV cache),
:mod:`.graphs` (CUDA-graph decode over the model and the cache), :mod:`.runner` (the step
runner), :mod:`.executor` (runs a scheduler's plans on the model), :mod:`.measure`
(step-cost profiles for the simulator) and :mod:`.checkpoint` (Hugging Face safetensors
checkpoints). The torch-free library (:mod:`batching`) never imports this package at import
time; the CLI loads it only for ``run`` and ``measure``.
"""
