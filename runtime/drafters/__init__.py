"""Where drafts come from: the proposers of every speculative mode, apart from the engine
that runs them (runtime/speculative.py's ``PROPOSERS`` names them). ``proposers`` holds the
Protocol and the model-free and draft-model proposers (ngram, small_draft), ``suffix`` the
suffix index, ``eagle`` / ``eagle_heads`` / ``medusa`` the heads on the target's features,
``merged`` the suffix index drafting with a head or a draft model. The C runtime mirrors
this room (runtime/capi/src/drafters/proposers.{h,cc}) with the same names."""
