"""An engine's flags: each engine's command-line options as its own parser defines them, one
table per release (``option_tables``, shipped in ``config/data``), which release a worker
plans for (``engine_release``, ``sglang_release``, ``vllm_release``), the flags the worker
reserves (``reserved_flags``) and the read-time rules of what a profile adds to the command
line (``launch_rules``); the SIE options each engine's adapters take, their flags and value
rules (``sglang_flags``, ``vllm_flags``, ``option_rules``), checked against the release
(``sglang_checks``, ``vllm_checks``)."""
