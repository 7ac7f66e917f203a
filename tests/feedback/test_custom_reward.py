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
    out = method.rewards("execution", [feedback([1.0, 0.5, 0.0, 0.0], ["3", None, " ", "4"]),
                                       feedback([0.25], [None])])
    # by hand: 1 + 0.1, 0.5 (no answer), 0 (a blank answer is none), 0 + 0.1; then 0.25
    np.testing.assert_allclose(out[0], [1.1, 0.5, 0.0, 0.1])
    np.testing.assert_allclose(out[1], [0.25])
    assert method.rewards("planning", []) == []  # the other players keep their sources


def test_a_method_without_verifiers_refuses_it_and_a_missing_module_is_named(copy):
    with pytest.raises(ValueError, match="rewards read verdicts: execution_reward=answer_bonus:verdict_with_answer_bonus"):
        build_method(compose(["experiment=tiny", "method=r_zero", f"method.execution_reward={SOURCE}"]))
    with pytest.raises(ValueError, match="cannot import 'no_such_module'.*PYTHONPATH"):
        build_method(compose(["experiment=tiny", "method.execution_reward=no_such_module:anything"]))


def test_a_module_path_names_a_source_of_that_module_only(copy):
    # answer_bonus registers verdict_with_answer_bonus, not the built-in verdict: a typo never picks a built-in
    with pytest.raises(ValueError, match="answer_bonus registers no execution reward source 'verdict'"):
        build_method(compose(["experiment=tiny", "method.execution_reward=answer_bonus:verdict"]))
