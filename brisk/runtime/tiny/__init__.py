"""The arithmetic world's old place, kept as an alias while imports move: the world now lives
outside the runtime's core, in :mod:`brisk.worlds.arithmetic`. Each ``brisk.runtime.tiny.<module>``
is that package's module of the same name (the same module object: importing one here puts the
world's module in its place). New code imports ``brisk.worlds.arithmetic``; this alias goes once
nothing imports it.
"""
