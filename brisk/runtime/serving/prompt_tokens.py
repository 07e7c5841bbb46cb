"""Text prompts tokenized in SGLang as ``brisk decode`` tokenizes them.

``brisk decode`` puts the tokenizer's BOS before a prompt's tokens unless the text already
starts with it (:func:`brisk.runtime.prompts.encode_prompt`): a prompt rendered from a template
that writes the BOS itself keeps one. SGLang's ``TokenizerManager._tokenize_texts`` calls the
tokenizer with its special tokens, whose post-processor adds a BOS in front of the one the text
holds, so the same text reached the model as ``[bos, bos, …]`` on the server and ``[bos, …]`` in
``brisk decode``. :func:`single_bos`, an AROUND hook the plugin puts on that method, drops the
added one: a text that starts with the BOS token gets one BOS, as in ``brisk decode``; every
other text is tokenized as SGLang tokenizes it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["drop_added_bos", "single_bos"]


def drop_added_bos(ids: list[int], bos: int) -> list[int]:
    """``ids`` without its first token when the first two are both ``bos`` (the tokenizer's in
    front of the text's own).

    >>> drop_added_bos([1, 1, 7], 1), drop_added_bos([1, 7], 1), drop_added_bos([1, 1, 1, 7], 1)
    ([1, 7], [1, 7], [1, 1, 7])
    """
    return ids[1:] if len(ids) >= 2 and ids[0] == ids[1] == bos else ids


async def single_bos(original: Any, self: Any, texts: Any, *args: Any, **kwargs: Any) -> Any:
    """``TokenizerManager._tokenize_texts`` with :func:`drop_added_bos` on each text's ids
    (AROUND hook; cross-encoder pairs are left as SGLang makes them)."""
    input_ids, token_type_ids = await original(self, texts, *args, **kwargs)
    bos = getattr(self.tokenizer, "bos_token_id", None)
    if bos is None or kwargs.get("is_cross_encoder") or (args and args[0]) or token_type_ids:
        return input_ids, token_type_ids
    if isinstance(texts, str):
        return drop_added_bos(list(input_ids), bos), token_type_ids
    return [drop_added_bos(list(ids), bos) for ids in input_ids], token_type_ids
