"""``speccompile serve``: the OpenAI-compatible HTTP server (``app``), its request schemas
(``api``) and its Prometheus metrics (``metrics``), over runtime/scheduler.py.
"""
