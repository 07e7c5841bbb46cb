"""Tasks: a user's problems, how they are prompted, their reference answers and their grader.

>>> from brisk.runtime.tasks import PromptFormat, Source, Task
>>> task = Task(Source("gsm8k.jsonl", {"prompt": "question", "answer": "answer"}),
...             PromptFormat(template="Question: {prompt}\\nAnswer:"), grader="gsm8k")

``task.problems(tokenizer)`` reads and formats the problems, ``task.grade(problems, responses)``
grades responses in parallel. The arithmetic world is the registered task ``arithmetic``
(:func:`get_task`).
"""

from __future__ import annotations

from brisk.runtime.tasks.formats import PromptFormat
from brisk.runtime.tasks.graders import GRADERS, Grades, grade_all, resolve_grader
from brisk.runtime.tasks.sources import Source, read_records
from brisk.runtime.tasks.task import Problem, Task, get_task, register_task, task_names

__all__ = [
    "GRADERS",
    "Grades",
    "Problem",
    "PromptFormat",
    "Source",
    "Task",
    "get_task",
    "grade_all",
    "read_records",
    "register_task",
    "resolve_grader",
    "task_names",
]
