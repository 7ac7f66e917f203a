"""Methods without tools get a plain-text Execution prompt (§4.1, Appendix G.1): no rendered Execution prompt of
such a method mentions Python or a code fence, in every preset that does not set its own prompt."""
from __future__ import annotations

import pytest

from unifiedplayers.config import CONF_DIR, compose
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.players.execution import code_requests, execution_prompt

pytestmark = pytest.mark.cpu

METHODS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
# experiment=tiny sets its own one-line system prompt for every method (byte tokenizer, short prompts).
PRESETS = [None, "smoke", "paper_qwen3_4b", "paper_mimo_7b"]


def _compose(method, preset):
    return compose([f"method={method}"] + ([f"experiment={preset}"] if preset else []))


@pytest.mark.parametrize("preset", PRESETS)
def test_no_prompt_of_a_method_without_tools_asks_for_code(preset):
    tok = build_byte_tokenizer()
    cfgs = {m: _compose(m, preset) for m in METHODS}  # one composition per method (Hydra's compose is slow)
    # Absolute Zero's tasks are programs: its prompt shows code to reason about, so only math-task methods count.
    without = [m for m in METHODS if not cfgs[m].method.use_tools
               and (cfgs[m].method.extra or {}).get("task_format", "math") == "math"]
    assert {"r_zero", "socratic_zero", "vanilla"} <= set(without)
    for method in without:
        cfg = cfgs[method]
        text = execution_prompt(tok, cfg.player, "What is 6 * 7?")
        assert "What is 6 * 7?" in text
        for banned in ("python", "Python", "```"):
            assert banned not in text, (method, preset, banned)
        assert code_requests(cfg.player) == []
        assert "\\boxed{N}" in text  # the answer format the majority vote and the graders read


def test_tool_methods_keep_the_tool_prompt():
    # The check can fail: the tool prompt of the default methods asks for a python block.
    for method in ("unifiedplayers", "agent0"):
        assert code_requests(compose([f"method={method}"]).player) == ["```", "python"]
