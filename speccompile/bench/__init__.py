"""Measurement, never tests: ``bench`` in process (``runner``), one fresh process per run
(``oneshot``), against a server (``soak``), and llama.cpp beside ours (``llama_cpp``).
"""
