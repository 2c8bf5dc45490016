"""Capacity planning (``sie-worker size`` and the capacity warnings of ``plan``/``validate``).

- ``plan``: the pure arithmetic (weights, KV cache, minimum GPUs, width, replicas)
- ``model_stats``: what a model folder says (config.json shape, safetensors sizes)
- ``gpus``: GPU memory by type; ``capacity``: glue from a served model to a plan
"""
