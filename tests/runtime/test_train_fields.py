"""The fields the training configs share are declared once (brisk.runtime.train.fields): each
config inherits them, with their checks and help, and keeps today's TOML keys and flags."""

from __future__ import annotations

import argparse

import pytest

from brisk.cli import build_parser
from brisk.runtime.train import fields
from brisk.runtime.train.base.config import BaseTrainConfig, StepRun
from brisk.runtime.train.corrector.config import CollectOptions, CorrectorTrainConfig
from brisk.runtime.train.drafter.config import DrafterTrainConfig
from brisk.runtime.train.pretrain.config import PretrainConfig
from brisk.runtime.train.proposal.config import ProposalTrainConfig
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
    BaseTrainConfig: {"lr", "min_lr"},
    PretrainConfig: {"steps", "max_minutes"},
    ProposalTrainConfig: {"lr", "min_lr"},
    CorrectorTrainConfig: {"lr"},
    CollectOptions: {"samples", "top_k"},
}
# defaults that depend on other fields: declared `T | None`, resolved in one property
RESOLVED = {BaseTrainConfig: {"lr", "min_lr"}}


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
            declared = vars(config)["__annotations__"][name]
            if name in RESOLVED.get(config, ()):  # None: resolved by a property (peak_lr)
                assert declared == f"{own_type(shared[name], name)} | None"
            else:
                assert declared == own_type(shared[name], name)


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
    base = BaseTrainConfig()
    assert (base.peak_lr, base.final_lr, base.log_every) == (3e-3, 3e-4, 25)
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


def test_the_learning_rate_of_base_training_depends_on_init() -> None:
    """From scratch 3e-3 (→ 3e-4); from init a fine-tuning rate, 1e-4 (→ 1e-5), resolved in
    one place, so a config built first and given init later gets it too; a rate given is
    kept; the settings read back are the settings."""
    from brisk.runtime.train.base.config import INIT_LR, SCRATCH_LR

    assert (BaseTrainConfig().peak_lr, BaseTrainConfig().final_lr) == SCRATCH_LR == (3e-3, 3e-4)
    tuned = BaseTrainConfig().replace(init="runs/ar/final")
    assert (tuned.peak_lr, tuned.final_lr) == INIT_LR == (1e-4, 1e-5)
    assert tuned.replace(lr=3e-3).peak_lr == 3e-3
    assert BaseTrainConfig(lr=1e-4).final_lr == 1e-4  # the default end, at most the peak
    assert BaseTrainConfig.from_dict(tuned.to_dict()) == tuned
    with pytest.raises(ValueError, match=r"^add_mask_token: adds a MASK row of its own"):
        BaseTrainConfig(init="x", add_mask_token=True, mask_token_id=5)
    with pytest.raises(ValueError, match=r"^mask_token_id: must be ≥ 0"):
        DrafterTrainConfig(mask_token_id=-1)


def test_the_mask_flag_is_declared_once(capsys: pytest.CaptureFixture[str]) -> None:
    """--mask-token-id of every command comes from MaskId's field; --init's learning rate is
    said in --lr's help."""
    parser = build_parser()
    for argv in (
        ["train", "base"],
        ["train", "proposal"],
        ["train", "drafter"],
        ["train", "selfgen", "--checkpoint", "c", "--out", "o"],
        ["train", "eval", "--checkpoint", "c"],
        ["experiment", "drafter", "--config", "c"],
        ["serve", "--model", "m"],
    ):
        args = parser.parse_args([*argv, "--mask-token-id", "7"])
        assert 7 in (getattr(args, "mask_token_id", None), getattr(args, "cfg_mask_token_id", None))
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "base", "--help"])
    base = " ".join(capsys.readouterr().out.split())
    assert "1e-4 from init" in base
    assert "--add-mask-token" in base
