"""The Execution player's tool loop: real sandbox, scripted engine where a real model can't write the
text needed (a runnable code block), and the tiny random model for the real generation path."""
from __future__ import annotations

import pytest

from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.players.tool_loop import ToolLoopConfig, render_observation, run_tool_loop, scan_turn
from unifiedplayers.feedback.observation import observation_body, truncate_observation
from unifiedplayers.rollout.types import Completion, find_stop
from unifiedplayers.sandbox import Sandbox, SandboxConfig

pytestmark = pytest.mark.cpu


class ScriptedEngine:
    """Replays, per sample, a list of model outputs; honours stop strings like a real backend
    (text and tokens cut right after the earliest stop string). Records every context it saw."""

    def __init__(self, tokenizer, scripts):
        self.tokenizer = tokenizer
        self.scripts = scripts  # prompt text -> list of generations (one consumed per call)
        self.calls = []

    def continue_segments(self, contexts, n=1, max_new_tokens=None, stop=None, **kw):
        self.calls.append(len(contexts))
        outs = []
        for ctx in contexts:
            ids = [t for seg in ctx for t in seg.token_ids]
            text = self.tokenizer.decode(ids)
            key = next(k for k in self.scripts if text.startswith(k))
            full = self.scripts[key].pop(0)
            hit = find_stop(full, stop or [])
            stop_str = None
            if hit is not None:
                full, stop_str = full[: hit[0]], hit[1]
            toks = self.tokenizer(full, add_special_tokens=False)["input_ids"]
            reason = "stop"
            if max_new_tokens is not None and len(toks) > max_new_tokens:
                toks, reason, stop_str = toks[:max_new_tokens], "length", None
                full = self.tokenizer.decode(toks)
            outs.append([Completion(prompt_ids=ids, token_ids=toks, text=full,
                                    logprobs=[-0.5] * len(toks), finish_reason=reason, stop_str=stop_str)])
        return outs


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=5, memory_mb=512)) as sb:
        yield sb


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def test_code_runs_in_sandbox_and_observation_is_not_trainable(sandbox, tok):
    prompt = "Q1: what is 6*7?\n"
    engine = ScriptedEngine(tok, {prompt: [
        "Let me compute.\n```python\nprint(6*7)\n```\nIGNORED hallucinated text",
        "The result is 42, so \\boxed{42}.",
    ]})
    [[r]] = run_tool_loop(engine, sandbox, [prompt], ["what is 6*7?"], ToolLoopConfig(max_turns=3))
    assert r.status == "answered" and r.final_answer == "42" and r.num_tool_calls == 1
    assert r.observations == ["42"]
    assert "IGNORED" not in r.text
    assert r.text == ("Let me compute.\n```python\nprint(6*7)\n```\n" + render_observation("42")
                      + "The result is 42, so \\boxed{42}.")
    # segments: prompt, generated, observation, generated
    assert [s.trainable for s in r.segments] == [False, True, False, True]
    assert tok.decode(r.segments[2].token_ids) == "```output\n42\n```\n"
    ids, mask, old = r.flatten()
    assert len(ids) == len(mask) == len(old)
    assert tok.decode(ids) == prompt + r.text
    obs_start = len(r.segments[0].token_ids) + len(r.segments[1].token_ids)
    obs_len = len(r.segments[2].token_ids)
    assert mask[obs_start:obs_start + obs_len] == [0] * obs_len
    assert sum(mask) == len(r.segments[1].token_ids) + len(r.segments[3].token_ids)
    assert all(o == -0.5 for o, m in zip(old, mask) if m) and all(o == 0.0 for o, m in zip(old, mask) if not m)
    steps = [s.type for s in r.trajectory.steps]
    assert steps == ["reason", "code", "output", "reason"]
    assert r.trajectory.steps[1].code == "print(6*7)" and r.trajectory.steps[2].result == "42"


def test_batch_statuses_and_errors(sandbox, tok):
    prompts = {
        "P-answer\n": ["\\boxed{3}"],
        "P-error\n": ["```python\nraise ValueError('boom')\n```\n", "It failed. \\boxed{0}"],
        "P-loop\n": ["```python\nprint(1)\n```\n"] * 3,
        "P-none\n": ["I am not sure."],
        "P-open\n": ["```python\nprint(1)"],  # eos inside a code block
        "P-bare\n": ["Try:\n```\n", "print(2+2)\n```\n", "So \\boxed{4}"],  # unlabelled fence
        "P-long\n": ["x" * 50],
    }
    engine = ScriptedEngine(tok, {k: list(v) for k, v in prompts.items()})
    out = run_tool_loop(engine, sandbox, list(prompts), config=ToolLoopConfig(max_turns=3, max_new_tokens=40))
    by = {p: rs[0] for p, rs in zip(prompts, out)}
    assert by["P-answer\n"].status == "answered" and by["P-answer\n"].num_tool_calls == 0
    err = by["P-error\n"]
    assert err.status == "answered" and err.num_tool_calls == 1
    assert "ValueError: boom" in err.observations[0] and "[exit status 1]" in err.observations[0]
    assert by["P-loop\n"].status == "turn_limit" and by["P-loop\n"].num_tool_calls == 2
    assert by["P-none\n"].status == "no_answer" and by["P-none\n"].detail == "eos"
    assert by["P-open\n"].status == "error" and by["P-open\n"].detail == "unterminated_code_block"
    bare = by["P-bare\n"]
    assert bare.status == "answered" and bare.observations == ["4"]
    assert by["P-long\n"].status == "no_answer" and by["P-long\n"].detail == "length"
    # all active samples generate together: the first call carries all seven
    assert engine.calls[0] == 7


def test_timeout_and_truncation(sandbox, tok):
    prompt = "P\n"
    engine = ScriptedEngine(tok, {prompt: [
        "```python\nprint('a' * 5000)\n```\n",
        "```python\nwhile True: pass\n```\n",
        "\\boxed{1}",
    ]})
    cfg = ToolLoopConfig(max_turns=3, observation_max_chars=100, timeout_s=1.0)
    [[r]] = run_tool_loop(engine, sandbox, [prompt], config=cfg)
    assert r.status == "answered" and r.num_tool_calls == 2
    assert "characters truncated" in r.observations[0] and len(r.observations[0]) < 200
    assert "[timed out]" in r.observations[1]
    # the formatter the perturbation engine reuses gives the same text for the same result
    assert observation_body(sandbox.run("print('a' * 5000)"), 100) == r.observations[0]


def test_scan_turn_rules():
    assert scan_turn("x \\boxed{2}\n```python\nprint(1)\n```\n").kind == "answer"
    s = scan_turn("a\n```python\nprint(1)\n```\nmore")
    assert s.kind == "code" and s.code == "print(1)" and "a\n```python\nprint(1)\n```\nmore"[: s.cut].endswith("```\n")
    assert scan_turn("```bash\nls\n```\nthen \\boxed{5}").kind == "answer"
    assert scan_turn("```python\nprint('\\boxed{1}')").kind == "open"
    assert scan_turn("nothing").kind == "none"
    assert truncate_observation("abc", 10) == "abc"


@pytest.mark.slow
def test_tiny_random_model_never_crashes(sandbox):
    from unifiedplayers.config import ModelConfig, RolloutConfig
    from unifiedplayers.models import load_model
    from unifiedplayers.rollout import build_rollout

    model, tokenizer = load_model(ModelConfig(name="tiny", source="tiny_random", dtype="float32", hidden_size=64,
                                              intermediate_size=128, num_attention_heads=2, num_key_value_heads=1))
    engine = build_rollout(RolloutConfig(backend="hf", max_new_tokens=24), model, tokenizer)
    out = run_tool_loop(engine, sandbox, ["Solve 1+1.\n", "Compute 2*3.\n"], n=2,
                        config=ToolLoopConfig(max_turns=2, max_new_tokens=24), seed=0)
    assert len(out) == 2 and all(len(rs) == 2 for rs in out)
    for rs in out:
        for r in rs:
            assert r.status in ("answered", "turn_limit", "no_answer", "error")
            ids, mask, old = r.flatten()
            assert len(ids) == len(mask) == len(old) and sum(mask) > 0
            assert all(lp <= 0.0 for lp, m in zip(old, mask) if m)
            assert r.segments[0].trainable is False


def test_engine_failure_and_context_limit_end_only_their_samples(sandbox, tok):
    class Flaky(ScriptedEngine):
        def continue_segments(self, contexts, **kw):
            if any("BAD" in self.tokenizer.decode([t for seg in c for t in seg.token_ids]) for c in contexts):
                raise RuntimeError("boom")
            return super().continue_segments(contexts, **kw)

    long_prompt = "LONG " * 40 + "\n"
    engine = Flaky(tok, {"ok\n": ["\\boxed{1}"], "BAD\n": ["never"], long_prompt: ["never"]})
    out = run_tool_loop(engine, sandbox, ["ok\n", "BAD\n", long_prompt],
                        config=ToolLoopConfig(max_context_tokens=100))
    ok, bad, long = (rs[0] for rs in out)
    assert ok.status == "answered"
    assert bad.status == "error" and "RuntimeError: boom" in bad.detail
    assert long.status == "error" and long.detail == "context_limit"
