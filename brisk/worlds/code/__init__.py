"""The code world: the Python standard library's own source as a corpus
(:mod:`~brisk.worlds.code.corpus`), a byte-level BPE tokenizer trained on it
(:mod:`~brisk.worlds.code.tokenizer`), a Qwen3 model preset (:mod:`~brisk.worlds.code.model`) and
the held-out functions task with its graders (:mod:`~brisk.worlds.code.tasks`,
:mod:`~brisk.worlds.code.grader`).

Importing the package registers what it brings (:mod:`brisk.runtime.registry` imports it on the
first lookup): the tasks ``heldout-functions`` (documented functions of the held-out files,
graded ``compiles`` or ``exact-body``, graders registered by those names), ``stdlib`` (the
same task, named as the corpus ``brisk train ar`` trains on: ``[corpus] name = "stdlib"``) and
``python`` (the same again, named for a user's own folder of Python files: ``root``), each
with the settings presets ``stdlib`` and ``micro``; ``humaneval`` (HumanEval's 164 problems,
graded by running them: the grader ``humaneval``, :mod:`~brisk.worlds.code.humaneval`); and the
model preset ``code`` (settings presets ``small`` and ``micro``).
"""

from __future__ import annotations

import functools

from brisk.runtime.presets import register_preset
from brisk.runtime.tasks.graders import register_grader
from brisk.runtime.tasks.task import register_task
from brisk.worlds.code.grader import GRADERS
from brisk.worlds.code.humaneval import HumanEvalTask, humaneval
from brisk.worlds.code.model import CodeModelConfig, code_preset, preset_tokenizer
from brisk.worlds.code.tasks import PRESETS, CodeTask, CodeTaskConfig

for _name in ("heldout-functions", "stdlib", "python"):
    register_task(
        _name,
        functools.partial(CodeTask.build, name=_name),
        CodeTask.from_description,
        CodeTaskConfig,
        PRESETS,
    )
register_task("humaneval", HumanEvalTask.build, HumanEvalTask.from_description)
for _grader, _function in {**GRADERS, "humaneval": humaneval}.items():
    register_grader(_grader, _function)
register_preset(
    "code",
    code_preset,
    preset_tokenizer,
    CodeModelConfig,
    {"small": CodeModelConfig.small, "micro": CodeModelConfig.micro},
)
