"""llama.cpp: ``llama-server`` (and ``ggml-rpc-server`` on the followers of a group of
nodes), for GGUF models: its family (:mod:`.family`), argv (:mod:`.argv`), load checks
(:mod:`.checks`), reserved flags (:mod:`.reserved`) and release (:mod:`.release`)."""
