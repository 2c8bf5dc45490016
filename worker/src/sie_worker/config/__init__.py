"""Model configs: their shape (the JSON Schema), the rules beside it, and what a load reads.

- ``model``: ModelConfig, Profile, ServedModel (a config as read, its profiles resolved)
- ``reader``: read YAML/JSON files and folders; schema, rules, profile resolution
- ``rules``: read-time rules (width, reserved flags, device variables, profiles)
- ``schema``: the JSON Schema and its errors as readable problems
- ``loadtime``: load-time options per adapter (accepted keys, defaults, rules)
- ``adapters``: ``adapter_path`` to the adapter's declaration (``sie_server.adapters``)
- ``sglang_options``, ``reserved_flags``, ``sglang_release``: SGLang's flags as its own
  parsers resolve them, per release, and the ones the worker reserves
- ``model_shape``: a model's files (local folder, config.json), head counts, the width rule
- ``hf_config``: a model's config.json read once (layers, heads, head_dim, dtype, ...)
- ``jsonpath``, ``yamldoc``: JSON paths for problems; strict YAML reading
"""
