"""The arithmetic world: seeded GSM8K-style problems (:mod:`~brisk.worlds.arithmetic.task`), their
grader, a character tokenizer, tiny Qwen3 model presets and a broad pre-training corpus.

Importing the package registers what it brings (:mod:`brisk.runtime.registry` imports it on the
first lookup): the task ``arithmetic`` (presets ``tiny``, ``paper``, ``trivial``), the corpus
task ``broad`` and the model preset ``tiny`` (settings presets ``tiny`` and ``micro``). A
training config names them (``[task] name = "arithmetic"``, ``[model] name = "tiny"``,
``[corpus] name = "broad"``) and never imports this package.
"""

from __future__ import annotations

from brisk.runtime.presets import register_preset
from brisk.runtime.tasks.task import register_task
from brisk.worlds.arithmetic.broad import BroadConfig, BroadTask
from brisk.worlds.arithmetic.model import TinyModelConfig, tiny_preset, tiny_tokenizer
from brisk.worlds.arithmetic.task import TaskConfig
from brisk.worlds.arithmetic.tasks import PRESETS, ArithmeticTask

register_task(
    "arithmetic", ArithmeticTask.build, ArithmeticTask.from_description, TaskConfig, PRESETS
)
register_task("broad", BroadTask.build, BroadTask.from_description, BroadConfig)
register_preset(
    "tiny",
    tiny_preset,
    tiny_tokenizer,
    TinyModelConfig,
    {"tiny": TinyModelConfig.tiny, "micro": TinyModelConfig.micro},
)
