"""The decode's options are declared once (``brisk.runtime.decode_options``): ``brisk decode``'s
ISD flags, the speculative loop's options, the servers' options and ``brisk serve``'s flags are
derived from the same fields, defaults and checks."""

from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from brisk.cli import decode, serve
from brisk.cli._common import config_overrides, with_overrides
from brisk.runtime.configs import field_docs
from brisk.runtime.decode_options import (
    DecodeOptions,
    ISDOptions,
    LoopOptions,
    SamplingOptions,
    SDOptions,
)
from brisk.runtime.serving.drafter_options import BriskDrafterOptions
from brisk.runtime.serving.options import BriskISDOptions, OptionError


def command(register: object) -> argparse.ArgumentParser:
    """A parser with one command, as ``brisk`` registers it."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="layer"))  # type: ignore[operator]
    return parser


def flags(parser: argparse.ArgumentParser, name: str) -> dict[str, argparse.Action]:
    """The actions of the command ``name``, by destination."""
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[name]._actions}


@pytest.mark.parametrize(
    ("register", "name", "cls", "left_out"),
    [
        pytest.param(decode.register, "decode", ISDOptions, {"eos_token_id"}, id="decode"),
        pytest.param(serve.register, "serve", BriskISDOptions, {"stride"}, id="serve"),
    ],
)
def test_every_option_is_a_flag_documented_by_its_field(
    register: object, name: str, cls: type, left_out: set[str]
) -> None:
    """One flag per field (``left_out``: the tokenizer's EOS; serve's --stride, which turns ISD
    on), its help the field's comment and the dataclass's default."""
    actions = flags(command(register), name)
    docs = field_docs(cls)
    for f in fields(cls):
        if f.name in left_out:
            continue
        action = actions[f"isd_{f.name}"]
        assert f.default is not MISSING
        assert action.help == f"{docs[f.name]} (default: {f.default!r})"
        assert action.default is None  # "not given": the dataclass supplies it


def test_decode_without_isd_flags_decodes_with_the_defaults() -> None:
    parser = command(decode.register)
    args = parser.parse_args(["decode"])
    assert with_overrides(ISDOptions(), config_overrides(args, ISDOptions, "isd_")) == ISDOptions()
    given = [
        "decode",
        "--stride",
        "6",
        "--temperature",
        "0.5",
        "--top-k",
        "3",
        "--shadow",
        "--max-new-tokens",
        "9",
        "--score-blocks",
    ]
    options = ISDOptions(**config_overrides(parser.parse_args(given), ISDOptions, "isd_"))
    assert options == ISDOptions(
        stride=6, temperature=0.5, top_k=3, shadow=True, max_new_tokens=9, score_blocks=True
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"stride": 1},
        {"stride": True},
        {"stride": "4"},
        {"temperature": -1},
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"temperature": "hot"},
        {"top_k": 0},
        {"top_k": 2.0},
        {"shadow": "yes"},
    ],
)
def test_one_check_for_the_shared_fields(bad: dict[str, object]) -> None:
    """Brisk's loop and the server refuse a bad shared option with the same line (the server's
    as its ``OptionError``)."""
    with pytest.raises(ValueError, match=f"^{next(iter(bad))}: ") as offline:
        ISDOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(OptionError) as served:
        BriskISDOptions(**bad)  # type: ignore[arg-type]
    assert type(offline.value) is ValueError
    assert str(served.value) == str(offline.value)


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1},
        {"temperature": math.inf},
        {"top_k": 0},
        {"top_k": 2.0},
    ],
)
def test_every_decoder_checks_the_sampling_fields_alike(bad: dict[str, object]) -> None:
    """The speculative loop and the drafter's server refuse a bad temperature or K with ISD's
    line: one check, in :class:`SamplingOptions`."""
    with pytest.raises(ValueError, match=f"^{next(iter(bad))}: ") as isd:
        ISDOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^{next(iter(bad))}: ") as sd:
        SDOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(OptionError) as drafter:
        BriskDrafterOptions(drafter="x", **bad)  # type: ignore[arg-type]
    assert str(sd.value) == str(drafter.value) == str(isd.value)
    with pytest.raises(ValueError, match=r"^max_new_tokens: need an integer ≥ 1, got 0$"):
        SDOptions(max_new_tokens=0)
    with pytest.raises(ValueError, match=r"^draft: one of greedy, sample, top-k, got 'x'$"):
        SDOptions(draft="x")  # type: ignore[arg-type]


def test_every_decoder_extends_the_shared_fields(tmp_path: Path) -> None:
    """Each decoder's options are the shared ones and its own, with the same defaults; the
    server's ISD options are the step's options themselves."""
    (tmp_path / "config.json").write_text("{}")  # a drafter checkpoint, as the options see it
    shared = {f.name for f in fields(DecodeOptions)}
    assert shared == {"stride", "temperature", "top_k", "shadow"}
    assert {f.name for f in fields(SamplingOptions)} == {"temperature", "top_k"}
    assert {f.name for f in fields(SDOptions)} == {f.name for f in fields(LoopOptions)} | {"draft"}
    served = BriskISDOptions(stride=6, temperature=0.5, top_k=3, seed=7)
    assert isinstance(served, DecodeOptions)
    assert (served.M, served.block_size) == (5, 11)
    for cls in (ISDOptions, SDOptions, BriskISDOptions, BriskDrafterOptions):
        default = cls(drafter=str(tmp_path)) if cls is BriskDrafterOptions else cls()
        for f in fields(cls):
            if f.name in {g.name for g in fields(ISDOptions)}:
                assert getattr(default, f.name) == getattr(ISDOptions(), f.name), (cls, f.name)
    drafter = SDOptions(temperature=0.5, top_k=3, draft="top-k").at_stride(4, 5)
    assert drafter == DecodeOptions(stride=4, temperature=0.5, top_k=5)
    deployed = SDOptions.deployed(ISDOptions(temperature=1.0, max_new_tokens=9, eos_token_id=2))
    assert deployed == SDOptions(temperature=1.0, max_new_tokens=9, eos_token_id=2, draft="top-k")
    assert SDOptions.deployed(ISDOptions()).draft == "greedy"


def test_top_k_0_says_why() -> None:
    with pytest.raises(ValueError, match="0 does not mean 'no limit'"):
        ISDOptions(top_k=0)
