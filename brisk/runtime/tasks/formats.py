"""How a problem becomes the text a model is prompted with.

- ``raw``: ``template.format_map(record)``, the record's roles as fields
  (``"Q: {prompt}\\nA:"``, or the default ``"{prompt}"``);
- ``chat``: the tokenizer's own chat template (``apply_chat_template``) over an optional system
  message and the user turn ``template.format_map(record)``, with the generation prompt added;
  ``thinking`` switches the template's ``enable_thinking`` (Qwen3's) where it has one.

>>> PromptFormat(template="Q: {prompt}=?\\n").render({"prompt": "3+4"})
'Q: 3+4=?\\n'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["PromptFormat"]


@dataclass(frozen=True)
class PromptFormat:
    """Raw template or chat template (module docstring)."""

    kind: Literal["raw", "chat"] = "raw"
    template: str = "{prompt}"
    system: str | None = None
    thinking: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("raw", "chat"):
            raise ValueError(f"kind: need raw or chat, got {self.kind!r}")
        if self.kind == "raw" and (self.system is not None or self.thinking is not None):
            raise ValueError("system, thinking: only a chat format has them")

    def check(self, tokenizer: Any, where: str = "the tokenizer") -> None:
        """Raise ``ValueError`` if ``tokenizer`` cannot render this format."""
        if self.kind != "chat":
            return
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError(f"format: chat asked, but {where} has no chat template")
        if self.thinking is not None and "enable_thinking" not in str(template):
            raise ValueError(f"thinking: the chat template of {where} has no enable_thinking")

    def render(self, record: dict[str, Any], tokenizer: Any = None) -> str:
        """The prompt text of one record (a tokenizer is needed for ``chat``)."""
        try:
            text = self.template.format_map(record)
        except KeyError as err:
            fields = ", ".join(k for k in record if not k.startswith("_"))
            raise ValueError(
                f"template: {{{err.args[0]}}} is not a field of the task (fields: {fields})"
            ) from None
        if self.kind == "raw":
            return text
        if tokenizer is None:
            raise ValueError("tokenizer: a chat format renders with the model's tokenizer")
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": text})
        extra = {} if self.thinking is None else {"enable_thinking": self.thinking}
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **extra
        )
        return str(rendered)
