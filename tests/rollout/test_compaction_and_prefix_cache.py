"""Tests that catch the bugs an audit planted in the hf engine's decoding economies: the ended-rows
compaction (``_Running.drop_ended``) filling a hole with an ended row or reading ``finish`` by batch place, and
the prefix cache handing back a whole stored prefix on a partial match. Each test names the plant it catches."""
from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pytest
import torch

from unifiedplayers.config import RolloutConfig
from unifiedplayers.rollout import build_rollout
from unifiedplayers.rollout import hf_engine
from unifiedplayers.rollout.prefix_cache import MIN_PREFIX, common_prefix_length
from tests.rollout.test_hf_decoding import assert_same, engines, generate_both_ways, one_thread, shared_prompts, tiny  # noqa: E402,F401

pytestmark = pytest.mark.skipif(hf_engine.DynamicLayer is None, reason="transformers without per-layer caches")


# ----------------------------------------------------------------------------- _Running.drop_ended


class RecordingCache:
    """A KV cache that only records which rows it was told to keep."""

    def __init__(self) -> None:
        self.kept: list[list[int]] = []

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.kept.append(rows.tolist())


def test_drop_ended_keeps_only_running_rows_and_reads_finish_by_row():
    """Catches the plants "no 'still running' check on the rows that fill a hole" (the first drop would keep
    rows [0, 2], the ended row 2 filling the hole of row 1) and "``finish[i]`` for ``finish[self.rows[i]]``"
    (the second drop, where batch place 1 holds row 3 and ``finish[1]`` is row 1's, would keep row 0 or none)."""
    next_pos = torch.tensor([[10], [11], [12], [13]])
    attention = torch.arange(4)[:, None].repeat(1, 3)  # row b's mask is all b: where each row went
    running = hf_engine._Running(4, next_pos, attention)
    cache = RecordingCache()

    running.drop_ended([None, "stop", "stop", None], cache)
    assert running.rows == [0, 3] and cache.kept == [[0, 3]]
    assert running.next_pos.tolist() == [[10], [13]] and running.attention[:, 0].tolist() == [0, 3]
    assert running.mine(torch.arange(4)[:, None]).tolist() == [[0], [3]]

    running.drop_ended(["stop", "stop", "stop", None], cache)  # batch place 0 (row 0) ends; place 1 is row 3
    assert running.rows == [3] and cache.kept[-1] == [1]
    assert running.next_pos.tolist() == [[13]] and running.attention[:, 0].tolist() == [3]
    assert running.mine(torch.arange(4)[:, None]).tolist() == [[3]]


def scripted_ends(model, end_positions: set[int], eos: int):
    """A copy of ``model`` whose greedy choice is ``eos`` exactly where the logits are those of a position in
    ``end_positions``, and never elsewhere; the other logits (the log-probs) are the model's own, so a row that
    reads another row's KV cache still shows."""
    model = copy.deepcopy(model)
    forward = model.forward

    @functools.wraps(forward)
    def scripted(*args, **kw):
        out = forward(*args, **kw)
        logits, last = out.logits[:, -1, :], kw["position_ids"][:, -1]
        ends = torch.tensor([int(p) in end_positions for p in last.tolist()], device=logits.device)
        logits[:, eos] = torch.where(ends, logits.max(dim=-1).values + 20.0, torch.full_like(logits[:, eos], -1e4))
        return out

    model.forward = scripted
    return model


def test_compaction_equals_the_full_batch_loop_when_rows_before_and_after_the_hole_end_together(tiny, monkeypatch):
    """Rows (in batch order, by prompt length) 1 and 2 end at step 3: row 1 leaves a hole, row 2 is past the new
    end of the batch and must not fill it; row 0 ends at step 6, when batch place 1 holds row 3.

    Catches the plant "no 'still running' check" (row 2 fills the hole and row 3 is dropped) and the plant
    "``finish[i]`` for ``finish[self.rows[i]]``" (at step 6 ``finish[1]`` is row 1's, so row 3 is dropped): either
    way row 3's tokens stop early, or the batch empties and the next forward fails."""
    model, tok = tiny
    lengths = [5, 8, 14, 30]  # logits positions of row b at step s: lengths[b] - 1 + s
    end_positions = {8 - 1 + 3, 14 - 1 + 3}  # rows 1 and 2 at step 3; row 0 reaches 10 at step 6; row 3 never
    scripted = scripted_ends(model, end_positions, tok.eos_token_id)
    prompts = [[3 + (17 * b + 5 * j) % 250 for j in range(n)] for b, n in enumerate(lengths)]
    engine = build_rollout(RolloutConfig(batch_size=0, prefix_cache="false"), scripted, tok)
    compacted, kept, shrinks = generate_both_ways(monkeypatch, engine, prompts, n=1, max_new_tokens=10, greedy=True)
    assert [len(row[0].token_ids) for row in kept] == [7, 4, 4, 10]
    assert [row[0].finish_reason for row in kept] == ["stop", "stop", "stop", "length"]
    assert shrinks == [2, 1]  # rows 0 and 3 after step 3, row 3 after step 6
    assert_same(compacted, kept)


# ----------------------------------------------------------------------------- prefix cache: partial matches


@pytest.mark.parametrize("diverges", [False, True], ids=["strict-prefix-of-stored", "diverges-from-stored"])
def test_prefix_cache_on_a_partial_match_of_a_stored_prefix_equals_the_plain_engine(tiny, diverges):
    """A first call stores the KV of a long shared prefix; the second call's prompts share only its first
    ``cut`` tokens (then their own parts, or first a common part that differs from the stored prefix): the
    store must hand back those ``cut`` positions only.

    Catches the plant "``PrefixStore.lookup`` returns the whole stored entry instead of the matched part": the
    second call's cache would hold the stored prefix's later positions too (outputs differ, or the cache
    cannot take its rows' length)."""
    model, tok = tiny
    cached, plain = engines(model, tok, batch_size=0)
    first = shared_prompts(tok)
    stored = first[0][: common_prefix_length(first)]
    cached.generate(first, n=1, max_new_tokens=2, greedy=True)
    assert list(cached._prefixes.entries) == [tuple(stored)]

    cut = MIN_PREFIX + 8
    assert len(stored) > cut + 8
    middle = tok("# something else entirely:", add_special_tokens=False)["input_ids"] if diverges else []
    assert not middle or middle[0] != stored[cut]
    own = ["Q: 9+9?", "Q: what is the square of eleven, please? A:", "?"]
    prompts = [stored[:cut] + middle + tok(s, add_special_tokens=False)["input_ids"] for s in own]
    assert common_prefix_length(prompts) == cut + len(middle) >= MIN_PREFIX

    hits = cached._prefixes.hits
    kw = dict(n=1, max_new_tokens=10, greedy=True)
    assert_same(cached.generate(prompts, **kw), plain.generate(prompts, **kw))
    assert cached._prefixes.hits == hits + cut  # the store served the matched part, no more
    kw = dict(n=2, max_new_tokens=10, temperature=1.0, seed=4)  # served again (whole, where the first call stored it)
    assert_same(cached.generate(prompts, **kw), plain.generate(prompts, **kw))
