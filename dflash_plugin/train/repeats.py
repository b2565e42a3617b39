"""Where a greedy answer starts going round in a loop.

Small targets decoding greedily often repeat a sentence or paragraph until the token cap: in
SmolLM2-135M's answers to the real-source prompts, 69% of the answer tokens lay past the third
occurrence of a 32-token span. Such a tail teaches a drafter nothing its first two cycles do
not, so answering stops there and training reads answers only up to there.
"""

from __future__ import annotations

LOOP_WINDOW = 32  # tokens: longer than any phrase a fluent answer repeats verbatim by chance
LOOP_TIMES = 3    # two whole cycles stay in the data, so a drafter still learns to follow a loop


def loop_end(ids: list[int], window: int = LOOP_WINDOW, times: int = LOOP_TIMES) -> int | None:
    """The end of the first `window`-token span that occurs for the `times`-th time in `ids`
    (the answer up to there keeps two cycles of the loop), or None when nothing repeats so."""
    if window < 1 or times < 2:
        raise ValueError("loop_end needs window >= 1 and times >= 2")
    seen: dict[tuple[int, ...], int] = {}
    for start in range(len(ids) - window + 1):
        span = tuple(ids[start:start + window])
        count = seen.get(span, 0) + 1
        if count >= times:
            return start + window
        seen[span] = count
    return None


def trim_loop(ids: list[int]) -> list[int]:
    """`ids` cut at loop_end, or unchanged when it does not loop."""
    end = loop_end(ids)
    return ids if end is None else ids[:end]
