"""vLLM: its family (:mod:`.family`), argv (:mod:`.argv`), option rules (:mod:`.flags`), load
checks (:mod:`.checks`) and releases (:mod:`.release`)."""
