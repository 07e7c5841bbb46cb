"""Import-only stand-ins that :func:`brisk.runtime.serving.cpu.activate` puts first on a CPU
server's ``PYTHONPATH``, where they are the top-level ``sgl_kernel`` and ``torchvision``.

They are subpackages here only so that a wheel of brisk ships them; do not import them by these
dotted names.
"""
