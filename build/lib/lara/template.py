"""The one owner of the Safe-RLHF conversation template; every stage formats prompts here."""

from __future__ import annotations

PROMPT_TEMPLATE = "BEGINNING OF CONVERSATION: USER: {input} ASSISTANT:"


def format_prompt(user_text: str) -> str:
    """Wrap a user request in the Safe-RLHF template (no trailing space: the model adds it)."""
    return PROMPT_TEMPLATE.format(input=str(user_text).strip())


def alpaca_user_text(instruction: str, input_text: str | None) -> str:
    """The user turn of an Alpaca record: the instruction, then the input if there is one."""
    instruction = str(instruction).strip()
    input_text = "" if input_text is None else str(input_text).strip()
    return f"{instruction}\n\n{input_text}" if input_text else instruction
