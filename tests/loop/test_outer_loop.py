"""The outer loop end to end on the tiny random model: blocks, records, checkpoints, fresh/stale
feedback, frozen players, resume. Runs are shared between tests (module fixtures) to keep this fast."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from unifiedplayers.config import compose
from unifiedplayers.diagnostics.logging import read_metrics
from unifiedplayers.diagnostics.records import load_records
from unifiedplayers.loop.outer import OuterLoop, StopRun
from unifiedplayers.schedule import blocks, position, seed_for, total_updates

pytestmark = pytest.mark.cpu

# One outer iteration: 2 Planning updates (so that a run can stop inside a block), 1 Execution, 1 Evaluation.
BASE = ["experiment=tiny", "schedule.planning_updates=2"]
TIMING = ("timing/",)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Snapshots:
    """Hook: the three players' weights at the start of the run and after every block."""

    def __init__(self):
        self.blocks = []
        self.violations = []

    def __call__(self, event, loop, slot):
        for role, p in loop.players.items():  # the frozen players: eval mode, no optimizer state in memory
            if role != slot.role and (p.model.training or (p.trainer is not None and p.trainer.optimizer is not None)):
                self.violations.append((slot.index, role))
        if event == "block_end":
            self.blocks.append((slot.role, {r: weights(p.model) for r, p in loop.players.items()}))


def run(tmp: Path, overrides=(), hooks=(), expect=None):
    cfg = compose(BASE + list(overrides))
    loop = OuterLoop(cfg, tmp, hooks=hooks)
    if expect is None:
        loop.run()
    else:
        with pytest.raises(expect):
            loop.run()
    return loop


def records_text(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


def metrics_wo_timing(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(TIMING)} for m in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """An uninterrupted fresh-feedback run; weights recorded at the start and after each block."""
    d = tmp_path_factory.mktemp("fresh")
    snaps = Snapshots()

    class Initial:
        def __call__(self, event, loop, slot):
            pass

    cfg = compose(BASE)
    loop = OuterLoop(cfg, d, hooks=[snaps])
    # weights before any update: every player is the backbone
    from unifiedplayers.models import load_model

    model, tok = load_model(cfg.model)
    initial = weights(model)
    loop._backbone = (model, tok)
    loop.run()
    return d, loop, snaps, initial


def test_end_to_end_one_outer_iteration(fresh):
    d, loop, _, _ = fresh
    metrics = read_metrics(d)
    assert [(m["outer_iteration"], m["block"], m["update"]) for m in metrics] == [
        (1, "planning", 0), (1, "planning", 1), (1, "execution", 0), (1, "evaluation", 0)]
    for m in metrics:
        for key in ("execution/reward_mean", "planning/U", "planning/V", "planning/R", "evaluation/rho_gold",
                    "evaluation/rho_adv", "evaluation/rho_red", "execution/accuracy_by_verifiers",
                    "timing/generation_s", "timing/sandbox_s", "timing/update_s"):
            assert key in m, key
        role = m["block"]
        for key in ("grad_norm", "kl", "clip_frac", "pad_share"):
            assert f"{role}/{key}" in m, (role, key)
        assert m[f"{role}/update_tflop"] > 0 and m["timing/update_tflop_per_s"] > 0
    # the bank's retention at each block's end (trainer.entropy_every 0: scored at the block's start and end only)
    ends = [i for i, m in enumerate(metrics) if i + 1 == len(metrics) or metrics[i + 1]["block"] != m["block"]]
    for i, m in enumerate(metrics):
        assert (f"{m['block']}/entropy_bank/retention" in m) == (i in ends), (i, m["block"])
    records = load_records(d / "records.jsonl")
    played = [r for r in records if r.meta["status"] == "played"]
    # Planning block: 1 prompt x G_T = 2 tasks per update, all played; other blocks: 1 task played.
    assert len(played) == 2 + 2 + 1 + 1
    for r in played:
        assert len(r.trajectories) == 2 and r.num_generated == 2 and r.rules == list(loop.perturber.rules)
        assert r.z_orig.shape == (len(r.valid), 2) and r.z_adv.shape == (len(r.valid), 2, 5)
        assert len(r.rewards["execution"]) == 2 and len(r.rewards["evaluation"]) == 2
        assert r.expected_answer == "7" and "7" not in r.question.split()
        assert len(r.meta["trajectory_status"]) == 2 and len(r.meta["verifier_outputs"]) == 2
    assert all(r.meta["status"] in ("played", "unused", "malformed_task") for r in records)
    for role in ("planning", "execution", "evaluation"):
        assert (d / "checkpoints" / "iter1" / role / "model.pt").exists()
    assert not (d / "checkpoints" / "resume").exists() or not any((d / "checkpoints" / "resume").iterdir())
    summary = json.loads((d / "summary.json").read_text())
    assert summary["updates"] == 4 and summary["records"] == len(records)
    assert "Verdict matrix" in (d / "summary.md").read_text()
    assert (d / "config.yaml").exists() and (d / "state.pt").exists()


def test_fresh_records_name_the_latest_checkpoints(fresh):
    d, _, _, _ = fresh
    by_update = {}
    for r in load_records(d / "records.jsonl"):
        by_update.setdefault(r.meta["global_update"], r.meta["checkpoints"])
    v = lambda role, it, step: {"player": role, "outer_iteration": it, "step": step}  # noqa: E731
    assert by_update[0] == {"planning": v("planning", 0, 0), "execution": v("execution", 0, 0),
                            "evaluation": v("evaluation", 0, 0)}
    assert by_update[1]["planning"] == v("planning", 1, 1)  # the active player samples with its latest weights
    assert by_update[2] == {"planning": v("planning", 1, 2), "execution": v("execution", 0, 0),
                            "evaluation": v("evaluation", 0, 0)}
    assert by_update[3] == {"planning": v("planning", 1, 2), "execution": v("execution", 1, 1),
                            "evaluation": v("evaluation", 0, 0)}


def test_players_are_frozen_outside_their_block(fresh):
    _, loop, snaps, initial = fresh
    assert snaps.violations == []
    assert all(p.trainer.outer_iteration == 1 for p in loop.players.values())  # π_ref reset once per iteration
    previous = {r: initial for r in ("planning", "execution", "evaluation")}
    assert [role for role, _ in snaps.blocks] == ["planning", "execution", "evaluation"]
    for role, state in snaps.blocks:
        for other in state:
            if other == role:
                assert not same(state[other], previous[other]), f"{role} was not updated in its block"
            else:
                assert same(state[other], previous[other]), f"{other} changed in the {role} block"
        previous = state


def test_stale_feedback_holds_updates_back_until_the_next_iteration(tmp_path):
    published = []  # the stale copies on disk while the run goes on

    def see(event, loop, slot):
        if event == "block_end":
            published.append(sorted(p.name for p in (tmp_path / "checkpoints" / "published").glob("*.pt")))

    loop = run(tmp_path, ["schedule.feedback=stale", "schedule.outer_iterations=2", "schedule.planning_updates=1",
                          "schedule.checkpoint_retention=weights"], hooks=[see])
    assert published[-1] == ["evaluation.pt", "execution.pt", "planning.pt"]
    assert not (tmp_path / "checkpoints" / "published").exists()  # the finished run's retention drops them
    seen = {}
    for r in load_records(tmp_path / "records.jsonl"):
        seen.setdefault((r.meta["outer_iteration"], r.meta["block"]), r.meta["checkpoints"])
    v = lambda role, it, step: {"player": role, "outer_iteration": it, "step": step}  # noqa: E731
    # iteration 1: co-players sample with the backbone even after their block
    assert seen[(1, "execution")]["planning"] == v("planning", 0, 0)
    assert seen[(1, "evaluation")]["planning"] == v("planning", 0, 0)
    assert seen[(1, "evaluation")]["execution"] == v("execution", 0, 0)
    # iteration 2: the checkpoints of iteration 1 are released
    assert seen[(2, "planning")] == {"planning": v("planning", 1, 1), "execution": v("execution", 1, 1),
                                     "evaluation": v("evaluation", 1, 1)}
    assert seen[(2, "execution")]["planning"] == v("planning", 1, 1)  # not step 2 (it2's update is held back)
    assert seen[(2, "evaluation")]["execution"] == v("execution", 1, 1)
    assert all(p.trainer.outer_iteration == 2 for p in loop.players.values())  # π_ref reset at each iteration


def test_frozen_planning_and_evaluation_keep_their_initial_weights(tmp_path):
    snaps = Snapshots()
    loop = run(tmp_path, ["schedule.train_planning=false", "schedule.train_evaluation=false"], hooks=[snaps])
    from unifiedplayers.models import load_model

    initial = weights(load_model(loop.cfg.model)[0])
    assert [role for role, _ in snaps.blocks] == ["execution"]  # their blocks are empty
    for role in ("planning", "evaluation"):
        assert loop.players[role].trainer is None
        assert same(weights(loop.players[role].model), initial)
    assert not same(weights(loop.players["execution"].model), initial)
    for r in load_records(tmp_path / "records.jsonl"):
        assert r.meta["checkpoints"]["planning"]["step"] == 0 and r.meta["checkpoints"]["evaluation"]["step"] == 0


# ---------------------------------------------------------------- resume


def assert_same_run(a: Path, b: Path):
    assert records_text(a) == records_text(b)
    assert metrics_wo_timing(a) == metrics_wo_timing(b)
    for role in ("planning", "execution", "evaluation"):
        wa = torch.load(a / "checkpoints" / "iter1" / role / "model.pt", weights_only=True)
        wb = torch.load(b / "checkpoints" / "iter1" / role / "model.pt", weights_only=True)
        assert same(wa, wb), role
        oa = torch.load(a / "checkpoints" / "iter1" / role / "optimizer.pt", weights_only=False)
        ob = torch.load(b / "checkpoints" / "iter1" / role / "optimizer.pt", weights_only=False)
        for k, st in oa["optimizer"]["state"].items():
            assert all(torch.equal(st[n], ob["optimizer"]["state"][k][n]) for n in st)
    sa = torch.load(a / "state.pt", weights_only=False)
    sb = torch.load(b / "state.pt", weights_only=False)
    for key in ("completed", "records", "metrics", "question_history", "prompt_counter", "versions", "finished"):
        assert sa[key] == sb[key], key


def test_resume_after_a_crash_at_the_first_block_end_equals_an_uninterrupted_run(fresh, tmp_path):
    reference = fresh[0]

    def crash(event, loop, slot):
        if event == "block_end" and slot.role == "planning":
            raise RuntimeError("injected crash")

    run(tmp_path, hooks=[crash], expect=RuntimeError)
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    assert state["completed"] == 2 and not state["finished"]
    with pytest.raises(FileExistsError, match="resume=true"):
        run(tmp_path)  # an existing run is never overwritten
    loop = run(tmp_path, ["resume=true"])
    assert loop.finished
    assert_same_run(reference, tmp_path)


def test_resume_inside_a_block_after_a_torn_update_equals_an_uninterrupted_run(fresh, tmp_path):
    reference = fresh[0]
    run(tmp_path, ["schedule.max_updates=1"])
    # A process killed during the next update: records and a metrics line written, state not yet.
    with open(tmp_path / "records.jsonl", "a") as f:
        f.write((tmp_path / "records.jsonl").read_text().splitlines()[0] + "\n" + '{"torn": ')
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"block": "planning"}\n')
    loop = run(tmp_path, ["resume=true"])
    assert loop.finished
    assert_same_run(reference, tmp_path)


def test_resume_refuses_a_changed_config(fresh):
    with pytest.raises(ValueError, match="player.num_trajectories"):
        run(fresh[0], ["resume=true", "player.num_trajectories=3"])
    run(fresh[0], ["resume=true", "logger.progress=true", "schedule.max_updates=7"])  # run control may change


def test_resume_accepts_a_setting_added_later_at_its_default(fresh, tmp_path):
    # A run saved by older code lacks a key the code has since gained: at its default it is no change.
    import shutil

    d = tmp_path / "older"
    shutil.copytree(fresh[0], d)
    state = torch.load(d / "state.pt", weights_only=False)
    state["config"].pop("method.verifiers")
    state["config"].pop("schedule.checkpoint_retention", None)
    torch.save(state, d / "state.pt")
    assert run(d, ["resume=true"]).finished
    with pytest.raises(ValueError, match="method.verifiers"):  # not at its default: a change
        run(d, ["resume=true", "method.verifiers=false", "method.roles=[planning,execution]",
                "method.planning_reward=uncertainty_repetition", "method.execution_reward=majority_vote"])


def test_resume_of_a_finished_run_only_rewrites_the_summary(fresh):
    d = fresh[0]
    before = (d / "records.jsonl").read_bytes()
    loop = run(d, ["resume=true"])
    assert loop.finished and (d / "records.jsonl").read_bytes() == before


def test_a_finished_run_keeps_what_checkpoint_retention_says(tmp_path):
    d = tmp_path / "run"
    loop = run(d, ["schedule.checkpoint_retention=weights"])
    assert loop.finished
    files = sorted(str(p.relative_to(d / "checkpoints")) for p in (d / "checkpoints").rglob("*.pt"))
    assert any(f.endswith("execution/model.pt") for f in files) and any(f.endswith("planning/model.pt") for f in files)
    assert not any(f.endswith(("optimizer.pt", "reference.pt")) for f in files), files
    # Resuming the finished run with a stricter retention (a run-control key) prunes further.
    run(d, ["resume=true", "schedule.checkpoint_retention=execution_weights"])
    left = sorted(str(p.relative_to(d / "checkpoints")) for p in (d / "checkpoints").rglob("*") if p.is_file())
    assert left and all("/execution/" in f for f in left), left
    assert (d / "summary.json").exists()
    with pytest.raises(ValueError, match="checkpoint_retention"):
        run(tmp_path / "other", ["schedule.checkpoint_retention=none"])


def test_a_running_run_thins_the_checkpoints_its_state_no_longer_names(tmp_path):
    # Two iterations under "weights", stopped after iteration 2's Planning block (updates 2 + 1 + 1 + 2): the
    # state now names iter2/planning, so iter1/planning keeps its weights only; iter1's Execution and
    # Evaluation checkpoints are still named (their next blocks resume from them) and keep everything.
    two = ["schedule.outer_iterations=2"]  # the default β_p > 0: each checkpoint holds π_ref (reference.pt)
    d = tmp_path / "thinned"
    run(d, [*two, "schedule.checkpoint_retention=weights", "schedule.max_updates=6"])
    ckpts = d / "checkpoints"

    def names(rel):
        return sorted(p.name for p in (ckpts / rel).iterdir())

    assert "model.pt" in names("iter1/planning")
    assert not {"optimizer.pt", "reference.pt"} & set(names("iter1/planning"))
    for rel in ("iter1/execution", "iter1/evaluation", "iter2/planning"):
        assert {"model.pt", "optimizer.pt", "reference.pt"} <= set(names(rel)), rel
    # Resumed to the end, it is the run that kept everything (the thinned files were never needed again).
    assert run(d, [*two, "schedule.checkpoint_retention=weights", "resume=true"]).finished
    kept = tmp_path / "kept"
    assert run(kept, two).finished
    assert records_text(d) == records_text(kept) and metrics_wo_timing(d) == metrics_wo_timing(kept)
    assert not list(ckpts.rglob("optimizer.pt")) and len(list(kept.rglob("optimizer.pt"))) == 6


def test_retention_of_a_deepspeed_checkpoint_keeps_its_model_pt_only(tmp_path):
    # A DeepSpeed checkpoint holds model.pt (full weights) beside deepspeed/ (engine state with the
    # optimizer partitions): "weights" keeps model.pt and drops the rest.
    from unifiedplayers.loop.checkpoints import prune

    ckpt = tmp_path / "checkpoints" / "iter1" / "planning"
    (ckpt / "deepspeed" / "state").mkdir(parents=True)
    for name in ("model.pt", "reference.pt", "trainer_state.pt", "deepspeed/state/zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        (ckpt / name).write_bytes(b"x")
    no_weights = tmp_path / "checkpoints" / "iter1" / "evaluation"  # no model.pt: its engine state is kept
    (no_weights / "deepspeed").mkdir(parents=True)
    prune(tmp_path, "weights")
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.pt", "trainer_state.pt"]
    assert (no_weights / "deepspeed").is_dir()


# ---------------------------------------------------------------- plan and seeds


def test_plan_of_updates_follows_the_block_order():
    cfg = compose(["experiment=tiny", "schedule.outer_iterations=2", "schedule.planning_updates=2",
                   "schedule.train_evaluation=false"])
    assert blocks(cfg) == [("planning", 2), ("execution", 1)] and total_updates(cfg) == 6
    # where a run that completed n updates goes on: (iteration, block, phase, step); past the end, iteration 3
    assert [position(cfg, n) for n in range(7)] == [
        (1, 0, 0, 0), (1, 0, 1, 0), (1, 1, 0, 0), (2, 0, 0, 0), (2, 0, 1, 0), (2, 1, 0, 0), (3, 0, 0, 0)]
    frozen = compose(["experiment=tiny", "method=vanilla"])
    assert blocks(frozen) == [] and position(frozen, 0)[0] == frozen.schedule.outer_iterations + 1
    assert len({seed_for(0, u, s) for u in range(50) for s in (10, 11, 20, 30)}) == 200


def test_bad_schedule_settings_fail_at_start_up(tmp_path):
    with pytest.raises(ValueError, match="fresh \\| stale"):
        OuterLoop(compose(["experiment=tiny", "schedule.feedback=lukewarm"]), tmp_path)
    with pytest.raises(ValueError, match="num_verifiers"):
        OuterLoop(compose(["experiment=tiny", "player.num_verifiers=0"]), tmp_path)
