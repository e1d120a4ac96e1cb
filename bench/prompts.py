"""Chat prompts of a given length in the model's tokens, for scenarios that fix it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.workload import PROMPTS

# Filler after the question: plain prose, cut to length.
FILLER = (
    "Take your time and cover the background, the main ideas, the people involved, the "
    "places where it happened, what changed afterwards and why it still matters today. "
)


class SizedPrompts:
    """``prompts(label)``: a user message of exactly ``tokens`` tokens once the model's chat
    template is applied (as the server counts ``prompt_tokens``). It starts with ``label``,
    so that no two requests share a cached prefix, then a question and filler text."""

    def __init__(self, model_dir: Path, tokens: int) -> None:
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        self.tokens = tokens
        self.filler = self.tokenizer.encode(FILLER * (tokens // 8 + 1), add_special_tokens=False)

    def length(self, content: str) -> int:
        messages = [{"role": "user", "content": content}]
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def __call__(self, label: str) -> str:
        question = f"{label}. {PROMPTS[sum(map(ord, label)) % len(PROMPTS)]}"
        shortest = self.length(question)
        if shortest > self.tokens:
            raise ValueError(
                f"{self.tokens} tokens cannot hold the chat template and a question ({shortest})"
            )
        cut = self.tokens - shortest

        def content(cut: int) -> str:
            return f"{question} {self.tokenizer.decode(self.filler[:cut])}".rstrip()

        # Decoding and re-encoding at the seams may merge or split a token: settle on the
        # longest cut that is not over the length.
        while cut > 0 and self.length(content(cut)) > self.tokens:
            cut -= 1
        while cut < len(self.filler) and self.length(content(cut + 1)) <= self.tokens:
            cut += 1
        return content(cut)
