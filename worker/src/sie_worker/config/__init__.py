"""Model configs: their shape (the JSON Schema, SIE 0.10.1's format), the rules beside it,
and what a load reads. Three rooms, and the config itself at the top:

- ``files/``: reading a file (YAML/JSON, schema, normalisation, the whole read)
- ``load/``: what a load resolves a profile to (load-time options, the model's files)
- ``flags/``: what every engine's flags share (option tables per release read from the
  engines' parsers, reserved flags as a parser resolves them, the value rules); each
  engine's own options and checks are its family's (``sie_worker.engines``)
- ``model``: ModelConfig, Profile, ServedModel (a config as read, its profiles resolved)
- ``rules``: read-time rules (weight source, profiles, grammar targets, routing)
- ``widths``: a model's width, the one home of the width rules
- ``runtime``: runtime options: read-time rules, the request body and timeouts they make
- ``adapters``, ``sie_adapters``: ``adapter_path`` to this image's adapters
  (``sie_server.adapters``) or SIE's other ones (shipped data)
- ``lora``, ``lora_choice``: a profile's LoRA adapters; which one a request names
- ``grammar_routing``: which profile answers a grammar-constrained request
"""
