"""A scripted rollout engine for tests: replays model text chosen by a function of the context.

It honours the rollout contract where the players depend on it: ``n`` samples per prompt, stop strings
(text and tokens cut right after the earliest one), ``max_new_tokens`` (finish_reason "length"), and a
behaviour log-prob per token.
"""
from __future__ import annotations

from typing import Callable, Optional

from unifiedplayers.rollout.types import Completion, find_stop, flatten_segments


class ScriptedEngine:
    def __init__(self, tokenizer, respond: Callable[[str, int], str]):
        """``respond(context_text, sample_index) -> text`` gives the model's continuation."""
        self.tokenizer = tokenizer
        self.respond = respond
        self.calls = 0

    def _complete(self, ids: list[int], j: int, max_new_tokens: Optional[int], stop) -> Completion:
        text = self.tokenizer.decode(ids)
        full = self.respond(text, j)
        hit = find_stop(full, stop or [])
        stop_str = None
        if hit is not None:
            full, stop_str = full[: hit[0]], hit[1]
        toks = self.tokenizer(full, add_special_tokens=False)["input_ids"]
        reason = "stop"
        if max_new_tokens is not None and len(toks) > max_new_tokens:
            toks, reason, stop_str = toks[:max_new_tokens], "length", None
            full = self.tokenizer.decode(toks)
        return Completion(prompt_ids=list(ids), token_ids=toks, text=full, logprobs=[-0.5] * len(toks),
                          finish_reason=reason, stop_str=stop_str)

    def generate(self, prompts, n=1, max_new_tokens=None, stop=None, **kw):
        self.calls += 1
        out = []
        for p in prompts:
            ids = self.tokenizer(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else list(p)
            out.append([self._complete(ids, j, max_new_tokens, stop) for j in range(n)])
        return out

    def continue_segments(self, contexts, n=1, max_new_tokens=None, stop=None, **kw):
        self.calls += 1
        return [[self._complete(flatten_segments(ctx)[0], j, max_new_tokens, stop) for j in range(n)]
                for ctx in contexts]

    def update_weights(self, model):
        pass
