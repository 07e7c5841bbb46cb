"""The fields the training configs share are declared once (brisk.runtime.train.fields): each
config inherits them, with their checks and help, and keeps today's TOML keys and flags."""

from __future__ import annotations

import argparse

import pytest

from brisk.cli import build_parser
from brisk.runtime.train import fields
from brisk.runtime.train.config import BaseTrainConfig, StepRun
from brisk.runtime.train.corrector_config import CollectOptions, CorrectorTrainConfig
from brisk.runtime.train.drafter_config import DrafterTrainConfig
from brisk.runtime.train.pretrain_config import PretrainConfig
from brisk.runtime.train.proposal_config import ProposalTrainConfig
from brisk.runtime.train.selfgen import SelfGenOptions

CONFIGS = (
    BaseTrainConfig,
    PretrainConfig,
    ProposalTrainConfig,
    CorrectorTrainConfig,
    SelfGenOptions,
    CollectOptions,
    DrafterTrainConfig,
)
GROUPS = (
    fields.Run,
    fields.Optimizer,
    fields.Schedule,
    fields.BudgetSchedule,
    fields.DataParallel,
    fields.Placement,
    fields.IDLMLoss,
    fields.ProblemSampling,
    StepRun,
)


# The inherited fields a config gives a default of its own (never a type): all it may redeclare.
OWN_DEFAULTS = {
    PretrainConfig: {"steps", "max_minutes"},
    ProposalTrainConfig: {"lr", "min_lr"},
    CorrectorTrainConfig: {"lr"},
    CollectOptions: {"samples", "top_k"},
}


def own(cls: type) -> set[str]:
    return set(vars(cls).get("__annotations__", {}))


def test_a_shared_field_is_declared_once() -> None:
    """Within a config, each inherited field comes from one group, and the config redeclares
    only the defaults it owns (same type); a copied field or check fails here."""
    for config in CONFIGS:
        shared: dict[str, type] = {}
        for group in (g for g in GROUPS if issubclass(config, g)):
            for name in own(group):
                assert name not in shared, (config, name, shared.get(name), group)
                shared[name] = group
        redeclared = own(config) & set(shared)
        assert redeclared == OWN_DEFAULTS.get(config, set()), config
        for name in redeclared:
            assert vars(config)["__annotations__"][name] == own_type(shared[name], name)


def own_type(group: type, name: str) -> str:
    return str(vars(group)["__annotations__"][name])


def test_the_groups_hold_what_the_configs_repeated() -> None:
    shared = ("seed", "threads", "lr", "weight_decay", "grad_clip")
    for config in (BaseTrainConfig, PretrainConfig, ProposalTrainConfig, CorrectorTrainConfig):
        assert set(shared) <= set(config.__dataclass_fields__), config
    placement = set(fields.Placement.__dataclass_fields__)
    for config in (BaseTrainConfig, ProposalTrainConfig):
        assert issubclass(config, fields.Placement)
        assert placement <= set(config.__dataclass_fields__)
    assert issubclass(DrafterTrainConfig, fields.DataParallel)  # no I-DLM mask
    assert set(fields.DataParallel.__dataclass_fields__) <= set(
        DrafterTrainConfig.__dataclass_fields__
    )
    # the defaults each config had before the groups
    assert (BaseTrainConfig().lr, BaseTrainConfig().min_lr, BaseTrainConfig().log_every) == (
        3e-3,
        3e-4,
        25,
    )
    assert (ProposalTrainConfig().lr, ProposalTrainConfig().min_lr) == (1e-3, 1e-4)
    assert (ProposalTrainConfig().log_every, ProposalTrainConfig().save_every) == (1, 0)
    assert (PretrainConfig().steps, PretrainConfig().max_minutes) == (1800, 16.0)
    assert (CorrectorTrainConfig().lr, CorrectorTrainConfig().batch_size) == (3e-4, 256)
    assert (CollectOptions().samples, CollectOptions().top_k) == (2, 32)
    assert (SelfGenOptions().samples, SelfGenOptions().top_k) == (4, 16)


@pytest.mark.parametrize(
    ("config", "change", "message"),
    [
        pytest.param(BaseTrainConfig, {"threads": 0}, "threads: must be ≥ 1", id="base-run"),
        pytest.param(PretrainConfig, {"min_lr": 1.0}, "min_lr: need 0 < min_lr ≤ lr", id="ar"),
        pytest.param(ProposalTrainConfig, {"lr": -0.1}, "lr: must be > 0", id="lr-before-min"),
        pytest.param(ProposalTrainConfig, {"micro_batch_size": -1}, "micro_batch", id="placement"),
        pytest.param(ProposalTrainConfig, {"alpha": -1.0}, "alpha: expected a num", id="idlm"),
        pytest.param(CorrectorTrainConfig, {"weight_decay": -0.1}, "weight_decay", id="adamw"),
        pytest.param(CorrectorTrainConfig, {"K": 0}, "K: must be an integer ≥ 1", id="own"),
        pytest.param(CollectOptions, {"stride": 1}, "stride: need an integer", id="sampling"),
        pytest.param(SelfGenOptions, {"chunk": 0}, "chunk: must be an integer", id="selfgen"),
    ],
)
def test_every_group_checks_its_fields_in_every_config(
    config: type, change: dict[str, object], message: str
) -> None:
    config()  # the defaults pass every check
    with pytest.raises(ValueError, match=message):
        config(**change)


def test_the_flags_keep_their_names() -> None:
    """``--lr``, ``--fsdp``, ``--precision``, ``--micro-batch-size``, ``--device`` as before,
    their help the shared declaration's."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    train = commands.choices["train"]
    sub = next(a for a in train._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("base", "proposal", "drafter"):
        flags = {s: a for a in sub.choices[command]._actions for s in a.option_strings}
        for flag in ("--lr", "--fsdp", "--precision", "--micro-batch-size", "--device"):
            assert flag in flags, (command, flag)
        assert flags["--fsdp"].help.startswith("FSDP2 shards instead of DDP replicas")
    args = parser.parse_args(["train", "proposal", "--lr", "0.002", "--fsdp"])
    assert (args.cfg_lr, args.cfg_fsdp) == (0.002, True)
