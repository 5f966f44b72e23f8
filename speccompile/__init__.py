"""speccompile: ahead-of-time speculative decoding compiler."""
__version__ = "0.1.0"
