"""arg_mutation writes a re-executed output exactly as the Execution tool loop writes observations
(Appendix F.1): same formatter, same ``observation_max_chars`` truncation."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.feedback.observation import observation_body, truncate_observation
from unifiedplayers.feedback.perturbation import PerturbationEngine
from unifiedplayers.players.tool_loop import ToolLoopConfig, run_tool_loop
from unifiedplayers.sandbox import Sandbox, SandboxConfig
from tests.players.scripted import ScriptedEngine  # noqa: E402

pytestmark = pytest.mark.cpu

MAX_CHARS = 100


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=5, memory_mb=512)) as sb:
        yield sb


def _tool_loop_trajectory(sandbox, code: str):
    """One real tool-loop sample whose single turn runs ``code``, then answers."""
    tok = build_byte_tokenizer()

    def respond(context: str, j: int) -> str:
        return "\\boxed{1}" if "```output" in context else f"```python\n{code}\n```\n"

    cfg = ToolLoopConfig(max_turns=2, observation_max_chars=MAX_CHARS)
    [[r]] = run_tool_loop(ScriptedEngine(tok, respond), sandbox, ["P\n"], questions=["q"], config=cfg)
    assert r.status == "answered", (r.status, r.detail)
    return r


def test_long_reexecuted_output_is_truncated_as_the_tool_loop_truncates(sandbox):
    original = _tool_loop_trajectory(sandbox, "print('a' * 5000)")
    traj = original.trajectory
    assert [s.type for s in traj.steps[:2]] == ["code", "output"]
    # The tool loop cut the 5000 characters to 66 head + marker + 34 tail (2/3 and 1/3 of 100).
    assert traj.steps[1].result == "a" * 66 + "\n[... 4900 characters truncated ...]\n" + "a" * 34

    engine = PerturbationEngine(["arg_mutation"], seed=0, sandbox=sandbox, observation_max_chars=MAX_CHARS)
    (variant,) = engine.perturb(traj)
    mutated = variant.steps[0].code
    n = int(mutated.split("*")[1].strip(" )"))
    assert n in (4998, 4999, 5001, 5002)  # 5000 + an offset from {-2, -1, +1, +2}
    # By hand: n characters -> head 66, marker "[... n-100 characters truncated ...]", tail 34.
    expected = "a" * 66 + f"\n[... {n - 100} characters truncated ...]\n" + "a" * 34
    assert variant.steps[1].result == expected
    # ... and it is what the tool loop itself shows for the mutated code.
    assert _tool_loop_trajectory(sandbox, mutated).observations[0] == expected


def test_without_the_limit_the_output_would_give_the_variant_away(sandbox):
    # The engine's default formatter is observation_body; max_chars 0 keeps everything (5000+ chars),
    # which is the untruncated output a verifier could tell from the originals.
    result = sandbox.run("print('a' * 5000)")
    assert len(observation_body(result, 0)) == 5000
    assert observation_body(result, MAX_CHARS) == truncate_observation("a" * 5000, MAX_CHARS)
    assert len(truncate_observation("a" * 5000, MAX_CHARS)) == 100 + len("\n[... 4900 characters truncated ...]\n")


def test_from_config_takes_the_players_limit(sandbox):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"rules": ["arg_mutation"], "int_offsets": [1], "float_rel_change": 0.05,
                            "substitute_lang": "bash"})
    engine = PerturbationEngine.from_config(cfg, seed=0, sandbox=sandbox, observation_max_chars=30)
    assert engine.observation_max_chars == 30
    (v,) = engine.perturb(_tool_loop_trajectory(sandbox, "print('b' * 40)").trajectory)
    # 40 + 1 = 41 characters -> head 20, marker of 11 cut, tail 10
    assert v.steps[1].result == "b" * 20 + "\n[... 11 characters truncated ...]\n" + "b" * 10
