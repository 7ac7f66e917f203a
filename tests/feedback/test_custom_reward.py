"""The worked extension examples/custom_reward/ (a reward term outside the package: one Python file, picked by the
``method.execution_reward`` key), run from a copy outside the repository, as a researcher would."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from unifiedplayers.config import compose
from unifiedplayers.methods import REWARD_SOURCES, build_method

pytestmark = pytest.mark.cpu

SOURCE = "answer_bonus:verdict_with_answer_bonus"


@pytest.fixture()
def copy(example_copy):
    yield example_copy("custom_reward", "answer_bonus")
    REWARD_SOURCES["execution"].pop("verdict_with_answer_bonus", None)  # the registry is the process's


def feedback(execution, answers):
    return SimpleNamespace(terms=SimpleNamespace(execution=execution), answers=answers)


def test_the_method_a_run_builds_gives_the_verdict_reward_plus_the_answer_bonus(copy):
    method = build_method(compose(["experiment=tiny", f"method.execution_reward={SOURCE}"]))  # start-up checks pass
    out = method.source("execution").over([feedback([1.0, 0.5, 0.0, 0.0], ["3", None, " ", "4"]),
                                           feedback([0.25], [None])])
    # by hand: 1 + 0.1, 0.5 (no answer), 0 (a blank answer is none), 0 + 0.1; then 0.25
    np.testing.assert_allclose(out[0], [1.1, 0.5, 0.0, 0.1])
    np.testing.assert_allclose(out[1], [0.25])
    assert method.source("planning").over([]) == []  # the other players keep their sources


def test_a_method_without_verifiers_refuses_it_and_a_missing_module_is_named(copy):
    with pytest.raises(ValueError, match="rewards read verdicts: execution_reward=answer_bonus:verdict_with_answer_bonus"):
        build_method(compose(["experiment=tiny", "method=r_zero", f"method.execution_reward={SOURCE}"]))
    with pytest.raises(ValueError, match="cannot import 'no_such_module'.*PYTHONPATH"):
        build_method(compose(["experiment=tiny", "method.execution_reward=no_such_module:anything"]))


def test_a_module_path_names_a_source_of_that_module_only(copy):
    # answer_bonus registers verdict_with_answer_bonus, not the built-in verdict: a typo never picks a built-in
    with pytest.raises(ValueError, match="answer_bonus registers no execution reward source 'verdict'"):
        build_method(compose(["experiment=tiny", "method.execution_reward=answer_bonus:verdict"]))


def test_the_contributing_guide_s_eq5_source_works_as_shown(tmp_path, monkeypatch):
    import re
    import sys
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "CONTRIBUTING.md").read_text(encoding="utf-8")
    (tmp_path / "my_rewards.py").write_text(re.search(r"```python\n(# my_rewards\.py.*?)```", guide, re.S).group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        method = build_method(compose(["experiment=tiny", "method.evaluation_reward=my_rewards:squared_redundancy"]))
        # valid verifiers 0 and 2 of M = 3; α, β, γ = 0.4, 0.5, 0.1:
        # v0: 0.4·1 + 0.5·0.75 − 0.1·0.2² = 0.771;  v2: 0.4·0.5 + 0.5·0 − 0.1·0.5² = 0.175;  v1 invalid: −1
        terms = SimpleNamespace(gold=np.array([1.0, 0.5]), adv=np.array([0.75, 0.0]), red=np.array([0.2, 0.5]))
        fb = SimpleNamespace(terms=terms, reward_cfg=method.cfg.reward,
                             verdicts=SimpleNamespace(valid=[0, 2], num_generated=3))
        np.testing.assert_allclose(method.source("evaluation")(fb), [0.771, -1.0, 0.175])
    finally:
        REWARD_SOURCES["evaluation"].pop("squared_redundancy", None)
        sys.modules.pop("my_rewards", None)
