"""The ``speccompile`` command line: each command parses and checks its arguments, then
calls the package that does the work (``main`` is the click group, ``python -m speccompile.cli``).
"""
