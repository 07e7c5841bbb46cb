"""The arithmetic world's old place, kept as an alias while imports move: the world now lives
outside the runtime's core, in :mod:`brisk.worlds.arithmetic`. ``brisk.runtime.tiny.<module>``
is that package's module of the same name (the same module object). New code imports
``brisk.worlds.arithmetic``; this alias goes once nothing imports it.
"""

from __future__ import annotations

import sys

from brisk.worlds.arithmetic import broad, grader, model, task, tasks, tokenizer

for _module in (broad, grader, model, task, tasks, tokenizer):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
