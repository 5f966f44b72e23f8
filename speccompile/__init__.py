"""speccompile: ahead-of-time speculative decoding compiler.

Importing the package (or any of its modules) changes nothing in the process: the TVM
thread count is set by our entry points before their first kernel, not here
(runtime/threads.py says which and why).
"""

__version__ = "0.1.0"
