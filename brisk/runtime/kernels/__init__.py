"""Kernels: each op has a float32 pure-torch ``naive.py`` twin written like the math."""
