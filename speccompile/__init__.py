"""speccompile: ahead-of-time speculative decoding compiler."""
from .runtime.threads import configure_threads

__version__ = "0.1.0"

configure_threads()  # before any TVM kernel runs: the thread pool reads it once (runtime/threads.py)
