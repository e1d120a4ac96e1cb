"""vLLM's per-token logprobs in OpenAI's two formats (chat and legacy completions)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vllm.logprobs import Logprob

from app.protocol import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob

PositionLogprobs = dict[int, Logprob]


def _text(entry: Logprob) -> str:
    return entry.decoded_token or ""


def _ranked(position: PositionLogprobs, k: int) -> list[Logprob]:
    ranked = sorted(position.values(), key=lambda e: e.rank if e.rank is not None else 1 << 30)
    return ranked[:k]


def chat_logprobs(
    token_ids: Sequence[int], positions: Iterable[PositionLogprobs | None], top_k: int
) -> ChatLogprobs:
    content = []
    for token_id, position in zip(token_ids, positions, strict=False):
        if position is None:
            continue
        chosen = position[token_id]
        content.append(
            TokenLogprob(
                token=_text(chosen),
                logprob=chosen.logprob,
                bytes=list(_text(chosen).encode()),
                top_logprobs=[
                    TopLogprob(token=_text(e), logprob=e.logprob, bytes=list(_text(e).encode()))
                    for e in _ranked(position, top_k)
                ],
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(
    token_ids: Sequence[int], positions: Iterable[PositionLogprobs | None], top_k: int, offset: int
) -> CompletionLogprobs:
    result = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for token_id, position in zip(token_ids, positions, strict=False):
        if position is None:
            continue
        chosen = position[token_id]
        result.tokens.append(_text(chosen))
        result.token_logprobs.append(chosen.logprob)
        result.top_logprobs.append({_text(e): e.logprob for e in _ranked(position, top_k)})
        result.text_offset.append(offset)
        offset += len(_text(chosen))
    return result
