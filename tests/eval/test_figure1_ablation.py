"""`make reproduce-figure1-ablation` (eval/probes/figure1_ablation.py): both arms trained and probed on the tiny
model, figure1_ablation.json's shape, the plot, the path printed last, and a rerun that trains nothing. An arm is
a `make reproduce-figure1` root of its own, so the same end-to-end run also checks eval/probes/figure1.py's
pipeline (train, probe each iteration, figure1.json, png; tests/eval/test_probes_figure1.py tests its parts):
one tiny training per arm serves both targets, which keeps the suite's CPU time down."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from eval.probes import figure1 as F
from eval.probes import figure1_ablation as A

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROBE_ARGS = ("--execution 2 --tool 2 --evaluation 2 --verifiers 1 --topics 1 --tasks-per-topic 2 "
              "--u-tasks 1 --u-samples 2")


def test_the_arms_jobs(tmp_path):
    jobs = A.arm_jobs(tmp_path, "tiny", [0, 1], ["x=1"], [], iterations=2)
    trains = [j for j in jobs if j.iteration < 0]
    assert [j.name for j in trains] == ["full: train seed 0", "full: train seed 1",
                                        "no_perturbation: train seed 0", "no_perturbation: train seed 1"]
    assert jobs[:4] == trains  # every training first
    for j in trains:
        arm = j.name.split(":")[0]
        assert f"run_dir={tmp_path / arm / f'seed{j.seed}'}" in j.argv and "x=1" in j.argv
        assert ("perturbation=none" in j.argv) == (arm == "no_perturbation")
    probes = jobs[4:]
    # the backbone once (first arm, first seed, three roles); then each arm x seed x iteration x role
    assert [(j.name.split(":")[0], j.seed) for j in probes if j.iteration == 0] == [("full", 0)] * 3
    assert len(probes) == 3 + 2 * 2 * 2 * 3
    # the endpoints first (the backbone, then the last iteration, both arms), then the middle iteration
    assert [j.iteration for j in probes] == [0] * 3 + [2] * 12 + [1] * 12
    assert [j.name.split(":")[0] for j in probes[3:15]] == ["full"] * 6 + ["no_perturbation"] * 6


def test_paired_differences_by_hand():
    def arm(per_seed):
        return {"per_seed": {s: {k: v for k, v in d.items()} for s, d in per_seed.items()}}

    base = {k: [0.5, 0.5] for k in F.SERIES}
    full = {"0": dict(base, **{"evaluation/adv_rejection": [0.2, 0.45], "planning/U": [0.1, 0.3]}),
            "1": dict(base, **{"evaluation/adv_rejection": [0.2, 0.30], "planning/U": [0.1, None]})}
    none = {"0": dict(base, **{"evaluation/adv_rejection": [0.2, 0.25], "planning/U": [0.1, 0.2]}),
            "1": dict(base, **{"evaluation/adv_rejection": [0.2, 0.20], "planning/U": [0.1, 0.2]})}
    d = A.paired_differences({"seeds": [0, 1], "arms": {"full": arm(full), "no_perturbation": arm(none)}})
    rej = d["evaluation/adv_rejection"]
    # seed 0: 45 − 25 = +20 points; seed 1: 30 − 20 = +10; mean 15, SD sqrt(((5)^2 + (5)^2) / 1) = 7.07
    assert rej["per_seed"] == pytest.approx([20.0, 10.0]) and rej["mean"] == pytest.approx(15.0)
    assert rej["sd"] == pytest.approx(50 ** 0.5)
    # U in its own units; seed 1 lacks the full arm's value, so only seed 0 counts and there is no SD
    assert d["planning/U"]["per_seed"][0] == pytest.approx(0.1) and d["planning/U"]["per_seed"][1] is None
    assert d["planning/U"]["mean"] == pytest.approx(0.1) and d["planning/U"]["sd"] is None
    assert d["execution/answered"] == {"per_seed": [0.0, 0.0], "mean": 0.0, "sd": 0.0}


def _write_evaluation_probe(path, accepted, per_rule):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metrics": {}, "evaluation": {"original_acceptance": accepted,
                                                             "per_rule_rejection": per_rule}}))


def test_rule_margins_by_hand(tmp_path):
    # seed 0, iteration 0: originals accepted 0.84 (rejected 0.16); step_drop variants rejected 0.16 -> margin 0,
    # early_terminate 0.41 -> +0.25. Iteration 1: a pool that rejects everything (originals accepted 0.1,
    # rejected 0.9): step_drop 0.9 -> 0, early_terminate 1.0 -> +0.1. Seed 1 has iteration 0 only.
    _write_evaluation_probe(F.probe_file(tmp_path / "seed0", 0, "evaluation"), 0.84,
                            {"step_drop": 0.16, "early_terminate": 0.41})
    _write_evaluation_probe(F.probe_file(tmp_path / "seed0", 1, "evaluation"), 0.1,
                            {"step_drop": 0.9, "early_terminate": 1.0})
    _write_evaluation_probe(F.probe_file(tmp_path / "seed1", 0, "evaluation"), 0.5,
                            {"step_drop": 0.7, "early_terminate": 0.6})
    m = A.rule_margins(tmp_path, [0, 1], [0, 1])
    assert list(m) == ["step_drop", "early_terminate"]
    assert m["step_drop"]["per_seed"]["0"] == pytest.approx([0.0, 0.0])
    assert m["early_terminate"]["per_seed"]["0"] == pytest.approx([0.25, 0.1])
    # seed 1: 0.7 − 0.5 = +0.2 and 0.6 − 0.5 = +0.1 at iteration 0; no probe at iteration 1
    assert m["step_drop"]["per_seed"]["1"][0] == pytest.approx(0.2) and m["step_drop"]["per_seed"]["1"][1] is None
    # means over the seeds with a value: (0 + 0.2) / 2, (0.25 + 0.1) / 2; iteration 1 from seed 0 alone
    assert m["step_drop"]["mean"] == pytest.approx([0.1, 0.0])
    assert m["early_terminate"]["mean"] == pytest.approx([0.175, 0.1])
    assert A.rule_margins(tmp_path / "absent", [0], [0]) == {}


def test_an_override_of_the_perturbation_engine_is_refused(capsys):
    with pytest.raises(SystemExit):
        A.main(["--experiment", "tiny", "perturbation=local"])
    assert "the arms set the perturbation engine" in capsys.readouterr().err


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    """One end-to-end ablation on the tiny model (both arms, one seed, one iteration): its root, argv and output."""
    root = tmp_path_factory.mktemp("figure1_ablation") / "abl"
    argv = ["--experiment", "tiny", "--root", str(root), "--seeds", "1", "--jobs", "2", "--probe-args", PROBE_ARGS,
            "schedule.outer_iterations=1"]
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(F, "POLL_S", 0.2)  # notice a finished job (and start the next) at once, not up to 2 s late
        rc = A.main(argv)
    return root, argv, rc, out.getvalue().strip().splitlines()


def test_figure1_ablation_end_to_end_on_the_tiny_model(ablation, capsys):
    from omegaconf import OmegaConf

    root, argv, rc, out = ablation
    assert rc == 0, "\n".join(out)
    path = Path(out[-1])  # the path of figure1_ablation.json is the last line
    assert path == root / "figure1_ablation.json"
    data = json.loads(path.read_text())
    assert data["iterations"] == [0, 1] and data["seeds"] == [0]
    assert list(data["arms"]) == ["full", "no_perturbation"]
    for arm, fig in data["arms"].items():
        assert list(fig["series"]) == list(F.SERIES), arm  # figure1.json's series, in its order
        assert {"execution/accuracy_tool", "evaluation/originals_accepted"} <= set(fig["series"])
        assert list(fig["per_seed"]) == ["0"]
        for key, values in fig["series"].items():
            assert len(values) == len(data["iterations"]) and values == fig["per_seed"]["0"][key], (arm, key)
        # the tool probe ran at both iterations (n = 2), and its binomial SE is reported as for the other series
        assert None not in fig["series"]["execution/accuracy_tool"]
        assert len(fig["probe_se"]["0"]["execution/accuracy_tool"]) == 2
        assert fig["sources"]["0"][1]["execution"].endswith(f"{arm}/seed0/checkpoints/iter1/execution/model.pt")
        assert json.loads((root / arm / "figure1.json").read_text())["series"] == fig["series"]
    full, ablated = data["arms"]["full"], data["arms"]["no_perturbation"]
    # the backbone is probed once and shared by both arms
    for key in F.SERIES:
        assert full["series"][key][0] == ablated["series"][key][0], key
    assert ablated["sources"]["0"][0]["execution"] == "backbone"
    assert data["arm_overrides"] == {"full": [], "no_perturbation": ["perturbation=none"]}
    assert data["full_minus_no_perturbation_last"] == A.paired_differences(data)
    # the rules' margins over the originals' rejection, from the same Evaluation probe files (the backbone's shared)
    margins = full["rule_margin"]
    assert margins.keys() == ablated["rule_margin"].keys()
    assert set(margins) <= set(OmegaConf.load(root / "full" / "seed0" / "config.yaml").perturbation.rules)
    assert all(ablated["rule_margin"][r]["mean"][0] == margins[r]["mean"][0] for r in margins)
    # the arms differ by the perturbation engine only (conf/perturbation/none.yaml: no rule)
    cfgs = {arm: OmegaConf.load(root / arm / "seed0" / "config.yaml") for arm in data["arms"]}
    assert list(cfgs["full"].perturbation.rules) and list(cfgs["no_perturbation"].perturbation.rules) == []
    assert (root / "figure1_ablation.png").read_bytes()[:8] == PNG_MAGIC
    # Run again: every member is finished, nothing is trained or probed again.
    rc = A.main(argv)
    again = capsys.readouterr().out
    assert rc == 0 and again.strip().splitlines()[-1] == str(path)
    assert again.count("already done") == 2 + 3 + 2 * 3  # two runs, the backbone, 2 arms x 3 roles at iteration 1
    assert "started" not in again
    assert json.loads(path.read_text())["arms"]["full"]["series"] == full["series"]



def test_an_arm_is_a_figure1_root_that_figure1_finds_done(ablation, capsys):
    """`make reproduce-figure1` on the full arm's root: the run and every probe are already there (the same jobs,
    built by eval/probes/figure1.py), so it trains and probes nothing and writes the arm's figure1.json again."""
    root, _, rc, _ = ablation
    assert rc == 0
    fig_root = root / "full"
    before = json.loads((fig_root / "figure1.json").read_text())
    rc = F.main(["--experiment", "tiny", "--root", str(fig_root), "--seeds", "1", "--probe-args", PROBE_ARGS,
                 "schedule.outer_iterations=1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("already done") == 1 + 2 * 3 and "started" not in out  # the run, then 2 checkpoints x 3 roles
    path = Path(out.strip().splitlines()[-1])  # the path of figure1.json is the last line
    assert path == fig_root / "figure1.json"
    fig = json.loads(path.read_text())
    assert fig["series"] == before["series"] and fig["iterations"] == [0, 1] and fig["seeds"] == [0]
    assert list(fig["series"]) == list(F.SERIES)
    for key, values in fig["series"].items():
        assert len(values) == 2 and values == fig["per_seed"]["0"][key], key
    assert fig["series"]["planning/well_formed"] == [1.0, 1.0]  # the tiny preset's response prefix
    # iteration 0 is the backbone, iteration i the run's checkpoints/iter<i> (one probe job per role)
    assert fig["sources"]["0"][0]["execution"] == "backbone"
    assert fig["sources"]["0"][1]["execution"].endswith("checkpoints/iter1/execution/model.pt")
    assert fig["sources"]["0"][1]["planning"].endswith("checkpoints/iter1/planning/model.pt")
    assert (fig_root / "figure1.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((fig_root / "seed0" / "figure1.json").read_text())["series"] == fig["series"]




def test_collect_only_writes_the_figures_of_what_is_done_and_starts_nothing(ablation, tmp_path, capsys):
    """A run spanning sessions: --collect-only with a second seed that was never trained, and one probe file
    of the first seed removed. Nothing starts; the json has the seeds asked for, null where nothing was done."""
    import shutil

    root, argv, rc, _ = ablation
    assert rc == 0
    copy = tmp_path / "abl"
    shutil.copytree(root, copy)
    F.probe_file(copy / "no_perturbation" / "seed0", 1, "evaluation").unlink()
    args = [*argv, "--root", str(copy), "--seeds", "2", "--collect-only"]  # argparse: the last --root and --seeds
    rc = A.main(args)
    out = capsys.readouterr().out
    assert rc == 0 and "started" not in out, out
    # the two trainings of seed 1 and their probes (2 arms x 3 roles), and the removed probe
    assert out.count("not run (--collect-only)") == 2 + 2 * 3 + 1
    data = json.loads(Path(out.strip().splitlines()[-1]).read_text())
    assert data["seeds"] == [0, 1]
    ablated = data["arms"]["no_perturbation"]
    assert ablated["per_seed"]["0"]["evaluation/adv_rejection"][1] is None  # its probe file was removed
    assert ablated["per_seed"]["0"]["execution/answered"][1] is not None
    # seed 1 has the shared backbone (copied) and nothing else
    assert ablated["per_seed"]["1"]["execution/answered"][0] is not None
    assert ablated["per_seed"]["1"]["execution/answered"][1] is None
    assert data["full_minus_no_perturbation_last"]["evaluation/adv_rejection"]["per_seed"] == [None, None]
    assert not (copy / "full" / "seed1" / "state.pt").exists()
    assert "PARTIAL (--collect-only" in out and "INCOMPLETE" not in out
    # before anything has begun (no arm directory yet): the files are written, every value null
    empty = tmp_path / "empty"
    assert A.main([*argv, "--root", str(empty), "--collect-only"]) == 0
    data = json.loads((empty / "figure1_ablation.json").read_text())
    assert data["arms"]["full"]["series"]["execution/answered"] == [None, None]
