"""Argument types and parser pieces shared by the layers' command lines."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    NoReturn,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from brisk._interrupt import INTERRUPTED

if TYPE_CHECKING:
    from brisk.runtime.configs import Config
    from brisk.runtime.tasks.spec import TaskSpec
    from brisk.runtime.train.harness import Recipe, TrainResult

T = TypeVar("T")
R = TypeVar("R")
Outcome = TypeVar("Outcome")
C = TypeVar("C", bound="Config")


def comma_separated(cast: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    """An argparse ``type`` reading ``"a,b,c"`` as a non-empty list of ``cast`` values.

    An empty entry (``"1,,2"``, ``"1,2,"``) is an error rather than silently skipped: it is
    almost always a typo for a missing value.
    """

    def parse(text: str) -> list[T]:
        items = [x.strip() for x in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError(f"expected at least one of the {what}, got {text!r}")
        if not all(items):
            empty = items.index("") + 1
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r} (entry {empty} is empty)"
            )
        try:
            return [cast(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r}"
            ) from None

    return parse


class OneLineErrors(argparse.ArgumentParser):
    """A parser whose errors are one line naming the argument, with no usage block.

    :meth:`error` raises ``ValueError("--flag: …")``, which :func:`brisk.cli.main` prints as
    ``brisk: error: --flag: …`` with exit code 2, exactly like the errors the commands raise
    after parsing. Pass it as ``parser_class`` to ``add_subparsers``.
    """

    def error(self, message: str) -> NoReturn:
        raise ValueError(message.removeprefix("argument "))


def flag_error(
    err: ValueError, names: Collection[str] | None = None, flags: Mapping[str, str] | None = None
) -> ValueError:
    """``err`` naming its flag where the runtime named an option or argument: ``name: …`` →
    ``--name: …`` (``batch_size`` → ``--batch-size``; ``flags`` maps a name to another flag,
    ``out_dir`` → ``out``), for a ``name`` among ``names`` (None: any); else ``err`` itself.

    >>> flag_error(ValueError("max_new_tokens: need an integer ≥ 1, got 0"))
    ValueError('--max-new-tokens: need an integer ≥ 1, got 0')
    """
    name, sep, rest = str(err).partition(":")
    if not (sep and name.isidentifier() and (names is None or name in names)):
        return err
    return ValueError(f"--{(flags or {}).get(name, name).replace('_', '-')}:{rest}")


@contextmanager
def flag_errors(
    names: Collection[str] | None = None, flags: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Inside: a ``ValueError`` naming an option or argument names its flag
    (:func:`flag_error`)."""
    try:
        yield
    except ValueError as err:
        named = flag_error(err, names, flags)
        if named is err:
            raise
        raise named from None


def with_overrides(cfg: T, overrides: dict[str, object], flags: dict[str, str] | None = None) -> T:
    """``cfg.replace(**overrides)`` for the values the command line gave (not None); an invalid
    value's error names its flag (``out_dir`` → ``--out`` through ``flags``, ``batch_size`` →
    ``--batch-size``)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cfg.replace(**given)  # type: ignore[attr-defined, no-any-return]
    except ValueError as err:
        key, _, rest = str(err).partition(":")
        flag = (flags or {}).get(key, key).replace("_", "-")
        raise ValueError(f"--{flag}:{rest}") from None


def config_from_args(
    cls: Any, config: Path | None, overrides: dict[str, object], flags: dict[str, str] | None = None
) -> Any:
    """``cls`` read from ``config`` (``--config``; the defaults without one), then
    :func:`with_overrides`; errors name the flag."""
    cfg = cls()
    if config is not None:
        try:
            cfg = cls.load(config)
        except ValueError as err:
            raise ValueError(f"--config: {err}") from None
    return with_overrides(cfg, overrides, flags)


def add_placement_arguments(parser: Any) -> None:
    """``--device`` and ``--dtype`` of every command that runs a model; the default (None) is
    :func:`brisk.runtime.loader.placement`'s: CUDA in bfloat16 where a GPU exists, else the
    CPU in float32."""
    parser.add_argument(
        "--device",
        default=None,
        help="torch device: cpu, cuda, cuda:1, mps (default: cuda where a GPU exists, else cpu)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16"),
        help="the model's dtype (default: bfloat16 on a GPU, float32 on the CPU)",
    )


def add_mask_argument(parser: Any) -> None:
    """``--mask-token-id`` of a command whose other options are no config carrying it (decode,
    eval, headroom, serve, the experiments): the flag of
    :class:`~brisk.runtime.train.fields.MaskId`'s field, declared there once, read back as
    ``args.mask_token_id`` (None: the checkpoint's own, by
    :func:`brisk.runtime.loader.checkpoint_mask_id`'s order)."""
    from brisk.runtime.train.fields import MaskId

    add_config_arguments(parser, MaskId, dest_prefix="")


def add_problem_decode_arguments(
    parser: argparse.ArgumentParser, cls: type, *, checkpoint: str, out: str
) -> None:
    """The flags of a decode over a task's problems (``brisk train selfgen`` and ``brisk train
    corrector collect``: both sample the deployed decoder): one per field of the options
    dataclass ``cls`` (:func:`add_config_arguments`), the task's, the checkpoint, output,
    resume and thread flags."""
    parser.add_argument("--checkpoint", type=Path, required=True, help=checkpoint)
    parser.add_argument("--out", type=Path, required=True, help=out)
    parser.add_argument(
        "--resume", action="store_true", help="continue an interrupted run into --out"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_placement_arguments(parser)
    add_config_arguments(parser, cls)
    add_task_arguments(parser, "the checkpoint's own world, its train split")


def problem_decode_options(cls: Callable[..., T], args: argparse.Namespace) -> T:
    """``cls`` from those flags, after checking the thread count and the checkpoint; an
    option's error names its flag."""
    from brisk.runtime.loader import placement

    if args.threads < 1:
        raise ValueError(f"--threads: must be an integer ≥ 1, got {args.threads}")
    placement(args.device, args.dtype)  # before the task and the model are read
    task = task_from_args(args)
    try:
        options = cls(**config_overrides(args, cls), task=task)  # type: ignore[arg-type]
    except ValueError as err:
        raise ValueError(f"--{str(err).replace('_', '-')}") from None
    if not (args.checkpoint / "config.json").is_file():
        raise ValueError(f"--checkpoint: {args.checkpoint} is not a checkpoint (no config.json)")
    return options


def run_problem_decode(
    cls: Callable[..., T], args: argparse.Namespace, run: Callable[..., R], **extra: Any
) -> R:
    """``run(checkpoint, out, options, show_progress, resume=, device=, dtype=, **extra)`` for a
    decode over a task's problems (``brisk train selfgen``, ``brisk train corrector collect``):
    the options of :func:`problem_decode_options`, the thread count set, transformers quiet,
    and a task's errors naming their flags."""
    import torch

    from brisk._hf import quiet_transformers
    from brisk.runtime.tasks.spec import task_flag_errors

    options = problem_decode_options(cls, args)
    torch.set_num_threads(args.threads)
    quiet_transformers()
    with task_flag_errors():
        return run(
            args.checkpoint,
            args.out,
            options,
            not args.no_progress,
            resume=args.resume,
            device=args.device,
            dtype=args.dtype,
            **extra,
        )


def add_task_arguments(parser: Any, default_help: str = "the checkpoint's own world") -> None:
    """The task's flags: ``--task NAME|PATH`` (a :class:`TaskSpec`'s ``name`` or ``path``) and
    one flag per other :class:`TaskSpec` field (:func:`add_config_arguments`)."""
    from brisk.runtime.tasks.spec import TaskSpec

    group = parser.add_argument_group("problems (a task)")
    group.add_argument(
        "--task",
        default="",
        metavar="NAME|PATH",
        help=f"a registered task (arithmetic) or a data file/directory (default: {default_help})",
    )
    add_config_arguments(group, TaskSpec, exclude=("name", "path"), dest_prefix="task_")


def add_problem_file_arguments(
    parser: Any,
    *,
    checkpoint_help: str,
    checkpoint_required: bool,
    seed_default: int | None,
    seed_help: str,
    out_help: str | None = None,
) -> None:
    """The flags of a command that writes a task's problems to a JSON Lines file (``brisk
    decode problems``, ``brisk tasks export``): the checkpoint whose world is the default task
    (``--checkpoint``), how many problems (``--n``), which (``--seed``), the file (``--out``)
    and the task (:func:`add_task_arguments`, by default the checkpoint's own world's test
    split)."""
    parser.add_argument(
        "--checkpoint", type=Path, required=checkpoint_required, help=checkpoint_help
    )
    parser.add_argument("--n", type=int, default=200, help="problems (from a file: all of fewer)")
    parser.add_argument("--seed", type=int, default=seed_default, help=seed_help)
    parser.add_argument("--out", type=Path, required=True, help=out_help)
    add_task_arguments(parser, "the checkpoint's own world, its test split")


def task_from_args(args: Any) -> TaskSpec:
    """The :class:`TaskSpec` of :func:`add_task_arguments`' flags (errors name the flag)."""
    from brisk.runtime.tasks.spec import TaskSpec

    is_path = bool(args.task) and (
        Path(args.task).exists() or any(ch in args.task for ch in "/.\\")
    )
    given: dict[str, Any] = config_overrides(args, TaskSpec, "task_")
    given["path" if is_path else "name"] = args.task
    try:
        return TaskSpec(**given)
    except ValueError as err:
        raise ValueError(f"--{err}") from None


def add_config_arguments(
    parser: Any,
    cls: type,
    *,
    exclude: Sequence[str] = (),
    rename: dict[str, str] | None = None,
    dest_prefix: str = "cfg_",
    negatable: bool = True,
    defaults: Mapping[str, str] | None = None,
) -> None:
    """One flag per scalar field of the config dataclass ``cls`` (nested configs excluded), its
    help the field's documentation (:func:`brisk.runtime.configs.field_docs`) and its default
    ``None``, "not given" (a config file or the dataclass supplies the value; ``defaults`` says
    in words what the command does instead where it does not take the field's). Spelling:
    ``batch_size`` → ``--batch-size`` (``rename`` maps a field to another flag name, e.g.
    ``out_dir`` → ``out``); booleans take ``--x`` / ``--no-x`` (``--x`` alone unless
    ``negatable``: a command without a config file, whose booleans all default to False, has
    no use for ``--no-x``, which would also make ``--n`` of its subcommands an ambiguous
    prefix), literals their choices, tuples comma-separated values. :func:`config_overrides`
    reads them back."""
    from brisk.runtime.configs import field_docs

    docs, hints = field_docs(cls), get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.name in exclude or dataclasses.is_dataclass(tp):
            continue
        flag = "--" + (rename or {}).get(f.name, f.name).replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        text = docs.get(f.name, "")
        help_ = f"{text} (default: {default!r})" if text else f"default: {default!r}"
        if "default:" in text:  # the field says its default itself (one that depends)
            help_ = text
        if f.name in (defaults or {}):
            help_ = f"{text} (default: {(defaults or {})[f.name]})"
        kwargs: dict[str, Any] = {"dest": dest_prefix + f.name, "default": None, "help": help_}
        if tp is bool and negatable:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif tp is bool:
            kwargs.update(action="store_const", const=True)
        elif get_origin(tp) is Literal:
            kwargs["choices"] = get_args(tp)
        elif get_origin(tp) is tuple:
            kwargs["type"] = comma_separated(_scalar(get_args(tp)[0]), "values")
            kwargs["metavar"] = "A,B,..."
        else:
            kwargs["type"] = _scalar(tp)
            kwargs["metavar"] = flag[2:].upper().replace("-", "_")
        parser.add_argument(flag, **kwargs)


def _scalar(tp: Any) -> Callable[[str], Any]:
    """A flag's parser for ``tp``: int, float, str, ``str | None``, or a union of numbers with
    literals (``"auto"``)."""
    if get_origin(tp) in (Union, UnionType):
        arms = get_args(tp)
        if str in arms:
            return str  # a path or a name (str | None): the flag's text as given
        literals = [a for arg in arms if get_origin(arg) is Literal for a in get_args(arg)]
        numbers = [arm for arm in arms if arm in (int, float)]

        def parse(text: str) -> Any:
            if text in literals:
                return text
            if text == "none" and type(None) in arms:
                return None
            for arm in numbers:
                try:
                    return arm(text)
                except ValueError:
                    pass
            named = "".join(f"{literal} or " for literal in literals)
            raise argparse.ArgumentTypeError(f"expected {named}a number, got {text!r}")

        return parse
    if tp in (int, float, str):
        return tp  # type: ignore[no-any-return]
    raise TypeError(f"no flag for a config field of type {tp!r}")  # a programming error


def config_overrides(
    args: argparse.Namespace, cls: type, dest_prefix: str = "cfg_"
) -> dict[str, Any]:
    """The fields of ``cls`` that :func:`add_config_arguments`' flags were given for (lists
    as tuples)."""
    given = {f.name: getattr(args, dest_prefix + f.name, None) for f in dataclasses.fields(cls)}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v is not None}


def _on_ranks(train: Callable[[], R]) -> R | int:
    """``train()`` on this rank (one process: rank 0). Rank 0 gets its result to print, and an
    interrupt propagates there (it says what was saved); any other rank ends quietly, with 0, or
    with INTERRUPTED when interrupted."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = train()
    except KeyboardInterrupt:
        if rank == 0:
            raise
        return INTERRUPTED
    return result if rank == 0 else 0


def add_run_flags(parser: Any, config_help: str) -> None:
    """The flags every ``brisk train`` recipe command takes before its config's own:
    ``--config`` (a TOML or JSON file, ``config_help``), ``--resume`` and ``--no-progress``
    (:func:`run_recipe` reads them)."""
    parser.add_argument("--config", type=Path, default=None, help=config_help)
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def add_recipe_arguments(parser: Any, config_class: type, config_help: str) -> None:
    """A ``brisk train`` recipe command's flags: :func:`add_run_flags`, then one per field of
    ``config_class`` (:func:`add_config_arguments`, ``out_dir`` as ``--out``)."""
    add_run_flags(parser, config_help)
    add_config_arguments(parser, config_class, rename={"out_dir": "out"})


def run_recipe(
    args: argparse.Namespace,
    config_class: type[C],
    recipe: Callable[[C], Recipe[C, Outcome]],
    report: Callable[[TrainResult[Outcome]], None],
    check: Callable[[C], None] | None = None,
) -> int:
    """A ``brisk train`` recipe command: its config from ``--config`` and the flags, checked
    (``check``), trained through the harness on this rank (:func:`_on_ranks`); rank 0 prints
    its result (``report``). Returns the exit status (another rank's passed on)."""
    from brisk._hf import quiet_transformers
    from brisk.runtime.train.harness import train

    overrides = config_overrides(args, config_class)
    cfg = config_from_args(config_class, args.config, overrides, {"out_dir": "out"})
    if check is not None:
        check(cfg)
    quiet_transformers()
    result = _on_ranks(lambda: train(recipe(cfg), not args.no_progress, resume=args.resume))
    if isinstance(result, int):
        return result
    report(result)
    return 0
