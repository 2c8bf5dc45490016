"""SGLang, the engine the product is built around: its family (:mod:`.family`), argv
(:mod:`.argv`), option rules (:mod:`.flags`), load checks (:mod:`.checks`) and releases
(:mod:`.release`)."""
