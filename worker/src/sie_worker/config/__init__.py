"""Model configs: their shape (the JSON Schema, SIE 0.10.1's format), the rules beside it,
and what a load reads.

- ``model``: ModelConfig, Profile, ServedModel (a config as read, its profiles resolved)
- ``reader``: read YAML/JSON files and folders; schema, rules, normalisation
- ``normalize``: one spelling per setting (SIE's and this project's), profile inheritance
- ``rules``, ``launch_rules``: read-time rules (width, reserved flags, device variables,
  weight source, profiles, grammar targets, routing)
- ``runtime``: runtime options: read-time rules, the request body and timeouts they make
- ``schema``: the JSON Schema and its errors as readable problems
- ``loadtime``: load-time options per adapter (accepted keys, defaults, rules)
- ``sglang_flags``: the SGLang adapters' options -> SGLang flags -> rules (one table)
- ``sglang_checks``, ``engine_options``: load-time checks against the bundle's SGLang
  release, and of the transformers engine's adapters
- ``adapters``, ``sie_adapters``: ``adapter_path`` to this image's adapters
  (``sie_server.adapters``) or SIE's other ones (shipped data)
- ``sglang_options``, ``reserved_flags``, ``sglang_release``: SGLang's flags as its own
  parsers resolve them, per release, and the ones the worker reserves
- ``model_shape``: a model's files (local folder, config.json), head counts, the width rule
- ``hf_config``: a model's config.json read once (layers, heads, head_dim, dtype, ...)
- ``jsonpath``, ``yamldoc``, ``values``: JSON paths and values in problems; strict YAML
"""
