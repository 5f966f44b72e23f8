"""The compiler front end: a checkpoint (HF folder, .bin, GGUF) -> converted weights
(``convert_weight``) -> ``speccompile-config.json`` (``gen_config``) -> one library per device
(``compile``, ``targets``); ``fetch`` prepares the real models of shared/MODELS.md once and caches them.
"""
