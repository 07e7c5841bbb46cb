"""What SGLang's ``BRISK_ISD`` worker and the DFlash hook share, and the checks a launch makes.

- :func:`validate_sampling` — why a request's sampling cannot be served exactly (or None);
- :func:`request_key` — a request's key for its uniforms, from SGLang's request id;
- :func:`rank_logger` — the block log of this process (TP rank 0 only);
- :func:`check_model` — the served model and the corrector against the options, before the
  model loads: one line naming the option (:class:`~brisk.runtime.serving.options.OptionError`).

Importing this module imports nothing of SGLang (:func:`rank_logger` asks SGLang for the tensor
parallel rank only when torch.distributed runs, which is inside SGLang's processes).
"""

from __future__ import annotations

import hashlib
from typing import Any

from brisk.runtime.isd.blocklog import BlockLogger
from brisk.runtime.serving.options import BriskISDOptions, OptionError

__all__ = ["check_model", "rank_logger", "request_key", "validate_sampling"]

ALGORITHM = "BRISK_ISD"


def validate_sampling(params: Any, temperature: float, algorithm: str = ALGORITHM) -> str | None:
    """Why a request's sampling parameters cannot be served at ``temperature`` (or None), the
    reason naming ``algorithm``.

    ISD is exact for plain sampling from p at the server's temperature (greedy: its argmax);
    truncation (top-k, top-p, min-p), penalties and logit processors change p per request and
    are not part of verification.

    >>> from types import SimpleNamespace as P
    >>> validate_sampling(P(temperature=0.0), 0.0) is None
    True
    >>> validate_sampling(P(temperature=0.7), 0.0)
    'temperature: BRISK_ISD serves greedy (its options); this request asks for temperature 0.7'
    """
    t = float(getattr(params, "temperature", 1.0))
    top_k = int(getattr(params, "top_k", -1))
    greedy = t == 0 or top_k == 1
    if (temperature == 0) != greedy or (not greedy and abs(t - temperature) > 1e-6):
        asked = "greedy" if greedy else f"temperature {t}"
        served = "greedy" if temperature == 0 else f"temperature {temperature}"
        return (
            f"temperature: {algorithm} serves {served} (its options); this request asks for {asked}"
        )
    if not greedy:
        for name, neutral in (("top_k", -1), ("top_p", 1.0), ("min_p", 0.0)):
            if getattr(params, name, neutral) not in (neutral, None) and not (
                name == "top_k" and getattr(params, name) >= (1 << 30)
            ):
                return f"{name}: not supported; {algorithm} verifies plain sampling from p"
    for name in ("json_schema", "regex", "ebnf", "structural_tag", "logit_bias"):
        if getattr(params, name, None):
            return f"{name}: not supported; {algorithm} verifies against the model's p"
    if getattr(params, "min_new_tokens", 0):
        return f"min_new_tokens: not supported; {algorithm} verifies against the model's p"
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(params, name, 0.0) not in (0.0, None):
            return f"{name}: not supported; {algorithm} verifies against the model's p"
    if getattr(params, "repetition_penalty", 1.0) not in (1.0, None):
        return f"repetition_penalty: not supported; {algorithm} verifies against the model's p"
    return None


def request_key(rid: str) -> int:
    """A request's key for its uniforms: a stable 63-bit hash of SGLang's request id (``rid``),
    the same in every process and never reused by a later request (unlike a pool slot).

    >>> request_key("req-1") == request_key("req-1") != request_key("req-2")
    True
    >>> 0 <= request_key("req-1") < 2**63
    True
    """
    return int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=8).digest(), "little") >> 1


def rank_logger(path: str, M: int, K: int) -> BlockLogger | None:
    """The block log of this process: tensor-parallel ranks see the same rows, so only TP rank
    0 logs; under torch.distributed each logging process writes its own ``rank{r}`` folder
    (``brisk mechanism report`` reads them all)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return BlockLogger(path, M, K)
    try:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

        tp_rank = get_tensor_model_parallel_rank()
    except Exception:  # pragma: no cover - outside SGLang's process groups
        tp_rank = 0
    if tp_rank != 0:
        return None
    return BlockLogger(f"{path}/rank{dist.get_rank()}", M, K)


def check_model(options: BriskISDOptions, model_config: Any) -> None:
    """Refuse, with one line naming the option, a served model or corrector that ``BRISK_ISD``
    cannot run with ``options``: a model without an integer ``mask_token_id`` in its vocabulary
    (ISD proposes from MASK slots), a stride whose verify window (2N − 1 slots after at least one
    token) exceeds the model's positions, a corrector built for another M or trained for
    another hidden size or vocabulary. (The corrector's K against ``top_k``, and everything
    about the options themselves, :meth:`BriskISDOptions.from_mapping` checks.)

    ``model_config`` is SGLang's ``ModelConfig`` of the served model (``hf_config``,
    ``hf_text_config``, ``vocab_size``, ``context_len``, ``model_path``), so the model's config
    overrides and ``--json-model-override-args`` apply.

    >>> from types import SimpleNamespace as C
    >>> model = C(hf_config=C(mask_token_id=11, hidden_size=32), vocab_size=12, context_len=8,
    ...           model_path="m")
    >>> check_model(BriskISDOptions(stride=4), model)
    >>> check_model(BriskISDOptions(stride=5), model)
    Traceback (most recent call last):
    ...
    brisk.runtime.serving.options.OptionError: stride: N = 5 verifies 2N − 1 = 9 slots after a \
request's tokens; m has 8 positions
    """
    hf = model_config.hf_config
    model = getattr(model_config, "model_path", "the model")
    vocab = int(model_config.vocab_size)
    mask_id = getattr(hf, "mask_token_id", None)
    if not isinstance(mask_id, int) or isinstance(mask_id, bool):
        arch = (getattr(hf, "architectures", None) or ["?"])[0]
        raise OptionError(
            f"--model-path: {model} ({arch}) declares no integer mask_token_id in its config; "
            f"{ALGORITHM} proposes from MASK slots (set it with --json-model-override-args "
            "'{\"mask_token_id\": ID}' if the checkpoint was trained with one)"
        )
    if not 0 <= mask_id < vocab:
        raise OptionError(
            f"--model-path: {model}'s mask_token_id {mask_id} is outside its vocabulary of {vocab}"
        )
    positions = getattr(model_config, "context_len", None)
    if positions is not None and options.block_size + 1 > int(positions):
        raise OptionError(
            f"stride: N = {options.stride} verifies 2N − 1 = {options.block_size} slots after "
            f"a request's tokens; {model} has {positions} positions"
        )
    if options.corrector is None:
        return
    try:
        c = options.corrector_config()
    except ValueError as err:  # not JSON
        raise OptionError(f"corrector: {options.corrector}: {' '.join(str(err).split())}") from None
    if c.get("M") != options.M:
        raise OptionError(
            f"corrector: built for M = {c.get('M')}, stride {options.stride} gives M = {options.M}"
        )
    text = getattr(model_config, "hf_text_config", hf)
    served = (int(text.hidden_size), vocab)
    if (c.get("hidden_size"), c.get("vocab_size")) != served:
        raise OptionError(
            f"corrector: trained for hidden {c.get('hidden_size')} / vocab {c.get('vocab_size')}, "
            f"{model} has {served[0]} / {served[1]}"
        )
