"""The ``sglang.srt.plugins`` entry point: ``register()`` runs in every SGLang process.

SGLang's ``load_plugins()`` calls :func:`register` (whitelist: ``SGLANG_PLUGINS``), then applies
the hooks registered here. :func:`register`

- adds ``BriskISD`` to ``sglang.srt.dllm.algorithm.algo_name_to_cls`` (``--dllm-algorithm
  BriskISD --dllm-algorithm-config brisk.yaml``);
- wraps ``DllmConfig.from_server_args`` (AROUND) so that ``BriskISD`` resolves its own block
  (2N − 1 slots) and admits any checkpoint that declares a ``mask_token_id``: I-DLM's
  ``SDARForCausalLM`` and Qwen3-layout models; other algorithms go to SGLang's own resolution;
- wraps DFlash's draft sampler (:mod:`brisk.runtime.serving.dflash`), active when
  ``BRISK_DFLASH_CORRECTOR`` names a corrector checkpoint;
- registers the speculative algorithm ``BRISK_ISD`` (:mod:`brisk.runtime.serving.worker`:
  ``--speculative-algorithm BRISK_ISD --speculative-num-draft-tokens 2N-1``, options from
  ``$BRISK_ISD_CONFIG``) and wraps the torch-native attention's extend so that its chain verify
  attends as SGLang's CUDA backends do (the hook acts on TARGET_VERIFY batches only).

SGLang logs a hook that fails to apply instead of raising, so :func:`installed` says which
targets brisk has actually patched.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ALGORITHM", "HOOKS", "installed", "register", "resolve_dllm_config"]

ALGORITHM = "BriskISD"
_CONFIG_TARGET = "sglang.srt.dllm.config.DllmConfig.from_server_args"
_DFLASH = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
_TORCH_NATIVE_EXTEND = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"
)
HOOKS = {
    _CONFIG_TARGET: "brisk.runtime.serving.plugin:resolve_dllm_config",
    f"{_DFLASH}._greedy_sample_from_vocab_parallel_head": "brisk.runtime.serving.dflash:rerank",
    f"{_DFLASH}._maybe_build_draft_sampler": "brisk.runtime.serving.dflash:eager_when_reranking",
    _TORCH_NATIVE_EXTEND: "brisk.runtime.serving.worker:verify_attention",
}


def register() -> None:
    """Add ``BriskISD`` to SGLang's dLLM algorithms, ``BRISK_ISD`` to its speculative
    algorithms, and register brisk's hooks."""
    from sglang.srt.dllm import algorithm as algorithms
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from brisk.runtime.serving.algorithm import BriskISD
    from brisk.runtime.serving.worker import ALGORITHM as SPECULATIVE
    from brisk.runtime.serving.worker import BriskISDSpec, BriskISDWorker

    algorithms.algo_name_to_cls[ALGORITHM] = BriskISD
    if get_spec(SPECULATIVE) is None:  # register() may run twice in one process
        SpeculativeAlgorithm.register(SPECULATIVE, spec_class=BriskISDSpec)(
            lambda server_args: BriskISDWorker
        )
    for target, hook in HOOKS.items():
        module, name = hook.split(":")
        HookRegistry.register(target, getattr(importlib.import_module(module), name),
                              HookType.AROUND)  # fmt: skip


def installed() -> dict[str, bool]:
    """Each hook target → whether it is wrapped by brisk's hook right now."""
    status = {}
    for target, hook in HOOKS.items():
        module_name, _, attr = target.rpartition(".")
        status[target] = hook in _hooks_of(_resolve(module_name, attr))
    return status


def _resolve(module_name: str, attr: str) -> Any:
    """``module.attr`` or ``module.Class.attr``; None when it cannot be imported."""
    owner: Any
    try:
        owner = importlib.import_module(module_name)
    except ImportError:
        parent, _, cls = module_name.rpartition(".")
        try:
            owner = getattr(importlib.import_module(parent), cls)
        except (ImportError, AttributeError):
            return None
    return getattr(owner, attr, None)


def _hooks_of(fn: Any) -> list[str]:
    """The ``module:name`` of every AROUND hook in a chain of SGLang wrappers (another plugin's
    wrapper may sit outside brisk's)."""
    hooks = []
    while fn is not None and getattr(fn, "__wrapped__", None) is not None:
        hook = _hook_of(fn)
        if hook is not None:
            hooks.append(hook)
        fn = fn.__wrapped__
    return hooks


def _hook_of(fn: Any) -> str | None:
    """The ``module:name`` of the AROUND hook a SGLang wrapper calls (its closure's ``hook``)."""
    fn = getattr(fn, "__func__", fn)
    names = fn.__code__.co_freevars
    cells = dict(zip(names, fn.__closure__ or (), strict=True))
    hook = cells.get("hook")
    if hook is None:
        return None
    value = hook.cell_contents
    return f"{value.__module__}:{value.__name__}"


def resolve_dllm_config(original: Any, server_args: Any) -> Any:
    """``DllmConfig.from_server_args`` for ``BriskISD``; SGLang's own for other algorithms.

    Reads the model config as SGLang does (``ModelConfig.from_server_args``: overrides and
    ``--json-model-override-args`` apply), the algorithm config YAML, and refuses with one line
    naming the option: a model without ``mask_token_id``, an unknown or ill-typed option, a
    corrector built for another hidden size, vocabulary or M."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    if cfg.dllm_algorithm != ALGORITHM:
        return original(server_args)

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.dllm.config import DllmConfig

    from brisk.runtime.serving.options import BriskISDOptions, OptionError

    raw = _read_yaml(cfg.dllm_algorithm_config)
    options = BriskISDOptions.from_mapping(raw)
    model_config = ModelConfig.from_server_args(
        server_args, model_path=cfg.model_path, model_revision=cfg.revision
    )
    hf = model_config.hf_config
    mask_id = getattr(hf, "mask_token_id", None)
    if not isinstance(mask_id, int) or isinstance(mask_id, bool):
        arch = (getattr(hf, "architectures", None) or ["?"])[0]
        raise RuntimeError(
            f"--model-path: {cfg.model_path} ({arch}) declares no integer mask_token_id in its "
            "config; BriskISD proposes from MASK slots (set it with --json-model-override-args "
            "'{\"mask_token_id\": ID}' if the checkpoint was trained with one)"
        )
    if options.corrector is not None:
        c = options.corrector_config()
        if c["M"] != options.M:
            raise OptionError(f"corrector: built for M = {c['M']}, stride {options.stride} "
                              f"gives M = {options.M}")  # fmt: skip
        served = (int(hf.hidden_size), int(model_config.vocab_size))
        if (c["hidden_size"], c["vocab_size"]) != served:
            raise OptionError(
                f"corrector: trained for hidden {c['hidden_size']} / vocab {c['vocab_size']}, "
                f"{cfg.model_path} has {served[0]} / {served[1]}"
            )
    return DllmConfig(
        algorithm=ALGORITHM,
        algorithm_config=raw,
        block_size=options.block_size,
        mask_id=mask_id,
        max_running_requests=cfg.max_running_requests or 1,
        first_done_first_out_mode=False,
        requires_separate_context_encoding=False,
    )


def _read_yaml(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml

    from brisk.runtime.serving.options import OptionError

    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise OptionError(f"--dllm-algorithm-config: {path} is not a YAML mapping")
    return data
