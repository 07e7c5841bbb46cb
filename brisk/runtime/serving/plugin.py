"""The ``sglang.srt.plugins`` entry point: ``register()`` runs in every SGLang process.

SGLang's ``load_plugins()`` calls :func:`register` (whitelist: ``SGLANG_PLUGINS``), then applies
the hooks registered here. :func:`register`

- registers the speculative algorithm ``BRISK_ISD`` (:mod:`brisk.runtime.serving.worker`:
  ``--speculative-algorithm BRISK_ISD --speculative-num-draft-tokens 2N-1``, options from the
  plugin config, the served model's config key ``brisk`` that ``--json-model-override-args``
  sets, :mod:`brisk.runtime.serving.options`; bad options, a model or a corrector that does not
  fit refuse the launch while SGLang resolves its arguments, ``BriskISDSpec.handle_server_args``);
- registers ``BRISK_DRAFTER`` (:mod:`brisk.runtime.serving.drafter_worker`: a DFlash-format
  drafter verified by the served AR target, options from the plugin config too; a drafter that
  does not fit the target refuses the launch the same way);
- wraps DFlash's draft sampler (:mod:`brisk.runtime.serving.dflash`), active when
  ``BRISK_DFLASH_CORRECTOR`` names a corrector checkpoint;
- wraps the torch-native attention's extend so that ``BRISK_ISD``'s chain verify attends as
  SGLang's CUDA backends do (the hook acts on TARGET_VERIFY batches only);
- wraps the tokenizer manager's request validation and the request's normalization
  (:mod:`brisk.runtime.serving.guard`): a request whose prompt a forward cannot take (a token
  id outside the vocabulary, no tokens, ``input_embeds`` of the wrong shape, a ``top_k`` past
  int32, an ``n`` that would expand it a million times, …) gets a 400 in the HTTP server
  instead of ending or hanging the scheduler, with ISD and without; and the body parser, so a
  body that is not a JSON object gets a 400 on the generation routes;
- wraps the tokenizer manager's text tokenization so that a text starting with the BOS token
  gets one BOS, as in ``brisk decode`` (:mod:`brisk.runtime.serving.prompt_tokens`);
- lets transformers read an I-DLM ``sdar`` config as the Qwen3 config it is, without the
  checkpoint's remote code (:func:`brisk.runtime.architectures.register_config_twins`), so
  ``brisk serve`` can run such a checkpoint as its causal twin
  (:func:`brisk.runtime.architectures.served_as`).

(The dLLM algorithm ``BriskISD`` of ``--dllm-algorithm`` is retired: SGLang 0.5.23's dLLM
scheduler commits whole blocks and could not run it; ``BRISK_ISD`` serves ISD instead.)

SGLang logs a hook that fails to apply instead of raising, so :func:`installed` says which
targets brisk has actually patched.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["HOOKS", "installed", "register"]

_DFLASH = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"
_TORCH_NATIVE_EXTEND = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"
)
_VALIDATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
_NORMALIZE = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"
_TOKENIZE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_texts"
_BODY = "sglang.srt.entrypoints.http_server.ORJSONRequest.json"
_CONTRACT = "sglang.srt.entrypoints.http_server.generate_contract_error"
HOOKS = {
    f"{_DFLASH}._greedy_sample_from_vocab_parallel_head": "brisk.runtime.serving.dflash:rerank",
    f"{_DFLASH}._maybe_build_draft_sampler": "brisk.runtime.serving.dflash:eager_when_reranking",
    _TORCH_NATIVE_EXTEND: "brisk.runtime.serving.chain:verify_attention",
    _VALIDATE: "brisk.runtime.serving.guard:validate_request",
    _NORMALIZE: "brisk.runtime.serving.guard:check_inputs",
    _TOKENIZE: "brisk.runtime.serving.prompt_tokens:single_bos",
    _BODY: "brisk.runtime.serving.guard:check_body",
    _CONTRACT: "brisk.runtime.serving.guard:generate_contract",
}


def register() -> None:
    """Add ``BRISK_ISD`` and ``BRISK_DRAFTER`` to SGLang's speculative algorithms, register
    brisk's hooks and the configs brisk reads as their transformers twins."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from brisk.runtime.architectures import register_config_twins
    from brisk.runtime.serving.drafter_worker import ALGORITHM as DRAFTER
    from brisk.runtime.serving.drafter_worker import BriskDrafterSpec, BriskDrafterWorker
    from brisk.runtime.serving.worker import ALGORITHM as SPECULATIVE
    from brisk.runtime.serving.worker import BriskISDSpec, BriskISDWorker

    register_config_twins()
    if get_spec(SPECULATIVE) is None:  # register() may run twice in one process
        SpeculativeAlgorithm.register(SPECULATIVE, spec_class=BriskISDSpec)(
            lambda server_args: BriskISDWorker
        )
    if get_spec(DRAFTER) is None:
        SpeculativeAlgorithm.register(DRAFTER, spec_class=BriskDrafterSpec)(
            lambda server_args: BriskDrafterWorker
        )
    for target, hook in HOOKS.items():
        module, name = hook.split(":")
        HookRegistry.register(
            target, getattr(importlib.import_module(module), name), HookType.AROUND
        )


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
