"""Bad input gets a clear error or a recorded failure, never rc 0 with garbage, and no record is lost or
written twice: resume of `make run`, a crash before the first completed update, a refused resume,
settings that are accepted by type but meaningless, misspelled keys, a damaged state or model file, the paper
schedule on a CPU."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from unifiedplayers.checks import validate
from unifiedplayers.config import compose
from unifiedplayers.loop.outer import OuterLoop

pytestmark = pytest.mark.cpu

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}


# ---------------------------------------------------------------- presets and `make run`

PRESETS = {  # experiment -> (resume, seed, run_dir): what each preset must compose to
    "smoke": (True, 0, "runs/smoke"), "tiny": (False, 0, None), "figure1_smoke": (False, 0, None),
    "ablation_smoke": (False, 0, None), "paper_qwen3_4b": (False, 0, None), "paper_mimo_7b": (False, 0, None),
    "one_gpu": (False, 0, None),
}


@pytest.fixture(scope="module")
def preset_cfgs():
    """Each preset composed once, for the tests that read or validate them."""
    return {name: compose([f"experiment={name}"]) for name in PRESETS}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished ``experiment=tiny`` run: started again by one test, the uninterrupted reference of another."""
    d = tmp_path_factory.mktemp("tiny")
    OuterLoop(compose(["experiment=tiny"]), d).run()
    return d


def test_every_preset_composes_its_own_resume_seed_and_run_dir(preset_cfgs):
    presets = {p.stem for p in (Path(__file__).parents[2] / "conf" / "experiment").glob("*.yaml")}
    assert presets == set(PRESETS)
    for name, want in PRESETS.items():
        cfg = preset_cfgs[name]
        assert (cfg.resume, cfg.seed, cfg.run_dir) == want, name  # the root config never wins over a preset
    assert compose(["experiment=smoke", "resume=false"]).resume is False  # the command line wins over both


def test_a_finished_run_started_again_prints_its_summary_and_adds_nothing(tiny_run, capsys):
    records = (tiny_run / "records.jsonl").read_text()
    capsys.readouterr()
    OuterLoop(compose(["experiment=tiny", "resume=true", "schedule.print_summary=true"]), tiny_run).run()
    out = capsys.readouterr().out
    assert "already complete" in out and "reward" in out.lower()  # the summary, printed again
    assert (tiny_run / "records.jsonl").read_text() == records


# ---------------------------------------------------------------- a crash before the first completed update

def _run_killed_in_first_update(run_dir: Path) -> None:
    script = textwrap.dedent(f"""
        import os, signal
        from unifiedplayers.config import compose
        from unifiedplayers.loop.outer import OuterLoop
        from unifiedplayers.trainer.torch_backend import TorchTrainer
        def update(self, batch, **kwargs):  # the first update: records are written, state.pt is not yet
            os.kill(os.getpid(), signal.SIGKILL)
        TorchTrainer.update = update
        OuterLoop(compose(["experiment=tiny"]), {str(run_dir)!r}).run()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (run_dir / "records.jsonl").read_text() and not (run_dir / "state.pt").exists()


def test_kill_9_before_the_first_completed_update_resumes_without_duplicates(tiny_run, tmp_path):
    reference = tiny_run
    killed = tmp_path / "killed"
    _run_killed_in_first_update(killed)
    with pytest.raises(FileExistsError, match="before its first save"):
        OuterLoop(compose(["experiment=tiny"]), killed).run()  # never appended to without resume=true
    OuterLoop(compose(["experiment=tiny", "resume=true"]), killed).run()
    assert (killed / "records.jsonl").read_text() == (reference / "records.jsonl").read_text()
    assert len((killed / "metrics.jsonl").read_text().splitlines()) == 3


def test_a_refused_resume_leaves_the_run_and_its_config_untouched(tmp_path):
    run_dir = tmp_path / "run"
    # The run to resume is made in this process; the command under test is the refused resume.
    OuterLoop(compose(["experiment=tiny", f"run_dir={run_dir}", "schedule.max_updates=1"]), run_dir).run()
    before = {p: (run_dir / p).read_text() for p in ("config.yaml", "records.jsonl", "metrics.jsonl")}
    proc = subprocess.run([sys.executable, "-m", "unifiedplayers.train", "experiment=tiny", f"run_dir={run_dir}",
                           "resume=true", "trainer.lr=0.5"], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode != 0 and "different config (trainer.lr: 0.001 -> 0.5)" in proc.stderr
    assert {p: (run_dir / p).read_text() for p in before} == before
    assert not (run_dir / ".hydra").exists()  # refused before Hydra writes its copy of the config there


# ---------------------------------------------------------------- settings that give garbage

@pytest.mark.parametrize("override, message", [
    ("sandbox.timeout_s=0", "sandbox.timeout_s=0.0: need > 0"),
    ("sandbox.wall_timeout_factor=0.5", "sandbox.wall_timeout_factor=0.5: need >= 1"),
    ("sandbox.memory_mb=1", "sandbox.memory_mb=1: need >= 32"),
    ("trainer.clip_eps=-0.2", r"trainer.clip_eps \(or trainer.roles.planning.clip_eps\)=-0.2: need > 0"),
    ("trainer.lr=-1", r"trainer.lr \(or trainer.roles.planning.lr\)=-1.0: need >= 0"),
    ("trainer.micro_batch_size=0", r"trainer.micro_batch_size \(or trainer.roles.planning.micro_batch_size\)=0"),
    ("+trainer.roles.execution.clip_eps=0", r"trainer.roles.execution.clip_eps\)=0"),
    ("+schedule.planing_updates=1", "schedule.planing_updates: unknown key \\(did you mean `planning_updates`\\?\\)"),
    ("+foo=1", "foo: unknown key"),
])
def test_meaningless_settings_fail_at_start_up_before_any_record(override, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        OuterLoop(compose(["experiment=tiny", override]), tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_misspelled_key_names_the_right_one():
    with pytest.raises(ValueError, match="did you mean `planning_updates`"):
        compose(["schedule.planing_updates=2"])
    with pytest.raises(ValueError, match="did you mean `lr`"):
        compose(["trainer.lrr=2"])
    proc = subprocess.run([sys.executable, "-m", "unifiedplayers.train", "experiment=tiny", "schedule.planing_updates=2"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode != 0 and "did you mean `planning_updates`" in proc.stderr


def test_the_paper_schedule_is_refused_on_a_cpu_without_experiment(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the paper schedule")
    proc = subprocess.run([sys.executable, "-m", "unifiedplayers.train", f"run_dir={tmp_path / 'r'}"],
                          capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0 and "experiment=smoke" in proc.stderr and "paper_qwen3_4b" in proc.stderr
    assert not (tmp_path / "r").exists()
    usage = subprocess.run([sys.executable, "-m", "unifiedplayers.train", "--help"], capture_output=True, text=True,
                           env=ENV, timeout=300)
    assert "experiment=smoke" in usage.stdout and "player.num_trajectories=K" in usage.stdout


# ---------------------------------------------------------------- damaged files

@pytest.mark.parametrize("content", [b"", b"not a checkpoint"])
def test_a_damaged_state_file_is_named_with_the_way_out(tmp_path, content):
    (tmp_path / "state.pt").write_bytes(content)
    with pytest.raises(RuntimeError, match=r"state.pt cannot be read .*rm .*state.pt.*resume=true"):
        OuterLoop(compose(["experiment=tiny", "resume=true"]), tmp_path).run()


def test_a_damaged_model_file_is_named(tmp_path):
    from unifiedplayers.models import ModelNotFoundError, load_model

    model, tok = load_model(compose(["experiment=tiny"]).model)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    weights = next((tmp_path / "m").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # a truncated copy
    cfg = compose(["model=qwen3_4b_base", f"model.path={tmp_path / 'm'}", "model.dtype=float32"]).model
    with pytest.raises(ModelNotFoundError, match=str(tmp_path / "m")):
        load_model(cfg)


def test_validate_accepts_every_preset(preset_cfgs):
    for name in PRESETS:
        validate(preset_cfgs[name])
