"""``make gpu-payload`` / ``make gpu-check``: what a GPU machine without TVM needs, built
here (``payload``, ``models``, ``capi``), and the check it runs there (``check``, ``torch_side``,
``profile``, ``chart``).
"""
