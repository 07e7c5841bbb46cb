"""Worlds: packages that register tasks and model presets with the runtime's registries.

Each subpackage is one world, loaded by the first registry lookup
(:func:`brisk.runtime.registry.load_worlds`); the runtime never imports one by name. brisk ships
:mod:`brisk.worlds.arithmetic`.
"""
