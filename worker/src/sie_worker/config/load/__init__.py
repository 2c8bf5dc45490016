"""What a load resolves a profile to: the load-time options each adapter accepts, their
defaults and rules (``loadtime``), the resolved options (``load_options``), the checks of
the transformers engine's adapters (``engine_options``), and the model's files and
``config.json`` a load reads (``model_shape``, ``hf_config``)."""
