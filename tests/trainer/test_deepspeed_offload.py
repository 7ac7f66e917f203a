"""ZeRO-Offload (DeepSpeed's CPU Adam), what an idle player's engine offloads, and the DeepSpeed version window.

The first ever run JIT-builds DeepSpeed's CPU Adam op (without debug information, one translation unit: 58 s of one
core on a quiet 2-core machine) into ~/.cache/unifiedplayers/torch_extensions/cpu_adam; later runs load it in a few seconds.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from unifiedplayers.trainer import build_trainer, deepspeed_backend  # noqa: E402
from unifiedplayers.trainer.deepspeed_backend import (  # noqa: E402
    DEEPSPEED_WINDOW,
    check_deepspeed_version,
    states_to_offload,
)

from tests.trainer.trainer_helpers import (  # noqa: E402
    assert_equals_torch_run,
    synthetic_batch,
    tiny_model,
    torch_reference_run,
    trainer_config,
)

pytestmark = pytest.mark.cpu

STEPS = 2
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def batches():
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(21)
    return [synthetic_batch(model, g) for _ in range(STEPS + 1)]


@pytest.fixture(scope="module")
def torch_run(batches):
    """The torch backend from the same start: per-step metrics and final weights."""
    return torch_reference_run(batches, STEPS)



# ---------------------------------------------------------------------------------------------- ZeRO-Offload
@pytest.mark.slow
def test_zero3_offload_optimizer_steps_with_cpu_adam_as_the_torch_backend(batches, torch_run, tmp_path):
    """``trainer.offload_optimizer`` (the paper presets): DeepSpeed refused our torch AdamW under ZeRO-Offload. The
    engine now steps with DeepSpeed's CPU Adam over the same groups (no decay on 1-D parameters), equal to the
    torch backend's update, and its checkpoint (optimizer state on the host) resumes bit-exactly."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    model, _ = tiny_model()
    cfg = trainer_config(backend="deepspeed_zero3", kl_coef=0.05, ref_mode="precompute", offload_optimizer=True)
    trainer = build_trainer(cfg, model)
    optimizer = trainer.engine.basic_optimizer
    assert isinstance(optimizer, DeepSpeedCPUAdam) and optimizer.adam_w_mode
    assert [g["weight_decay"] for g in optimizer.param_groups] == [cfg.weight_decay, 0.0]
    assert all(tuple(g["betas"]) == tuple(cfg.betas) and g["eps"] == cfg.adam_eps for g in optimizer.param_groups)
    trainer.start_outer_iteration()
    assert_equals_torch_run(trainer, [trainer.update(b) for b in batches[:STEPS]], torch_run)

    trainer.save_checkpoint(tmp_path / "execution")
    trainer.update(batches[STEPS])
    after = trainer.full_state_dict()
    trainer.load_checkpoint(tmp_path / "execution")
    assert trainer.global_step == STEPS
    trainer.update(batches[STEPS])
    for k, v in trainer.full_state_dict().items():
        assert torch.equal(v, after[k]), k


# ---------------------------------------------------------------------------------------------- offload_state
@pytest.mark.parametrize("stage, cpu_optimizer, optimizer, expected", [
    (2, False, "AdamW", ("optim_states", "hp_params", "lp_grads")),
    (2, True, "DeepSpeedCPUAdam", ("lp_grads",)),  # state and master weights already on the host
    (3, False, "AdamW", ("lp_grads", "contiguous_grad_buffer")),  # ZeRO-3 moves FusedAdam's only
    (3, False, "FusedAdam", ("optim_states", "hp_params", "lp_grads", "contiguous_grad_buffer")),
    (3, True, "DeepSpeedCPUAdam", ("contiguous_grad_buffer",)),
])
def test_states_to_offload_never_include_the_weights(stage, cpu_optimizer, optimizer, expected):
    states = states_to_offload(stage, cpu_optimizer, optimizer)
    assert states == expected
    assert "lp_params" not in states  # the weights the co-players sample from stay where they are


def _token_logprobs(trainer, batch):
    """What a sampler reads from the player: log-probs of the module's forward (gathered under ZeRO-3)."""
    ids = torch.tensor([batch[0].token_ids])
    with torch.no_grad(), trainer.gathered_weights():
        return torch.log_softmax(trainer.model(input_ids=ids).logits.float(), -1)


def _weight_storage(trainer):
    """Where each parameter's data lives (ZeRO-3: the rank's partition): a move or an emptied tensor shows."""
    return {n: (p.ds_tensor if hasattr(p, "ds_tensor") else p).data_ptr() for n, p in trainer.model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("backend, offload_optimizer", [
    ("deepspeed_zero2", False), ("deepspeed_zero3", False), ("deepspeed_zero3", True)])  # the last: paper presets
def test_offload_state_keeps_the_weights_co_players_sample_from(backend, offload_optimizer, batches, torch_run,
                                                                 monkeypatch):
    """A player goes idle (``team.start_block``/``end_block``) while its co-players sample from its weights. Its
    engine offloads optimizer state and gradient buffers only (the device faked as a GPU, so that the engine's
    offload_states runs as on one; on CPU only the host parking would): every weight stays in place with its values, a forward gives the same log-probs, and the next update,
    after the reload, equals the torch backend's. Before: ZeRO-2 moved the weights, ZeRO-3 asserted FusedAdam."""
    model, _ = tiny_model()
    extra = {"ref_mode": "precompute"} if backend == "deepspeed_zero3" else {}
    cfg = trainer_config(backend=backend, kl_coef=0.05, offload_optimizer=offload_optimizer, **extra)
    trainer = build_trainer(cfg, model)
    trainer.start_outer_iteration()
    metrics = [trainer.update(batches[0])]
    storage, weights = _weight_storage(trainer), trainer.full_state_dict()
    logprobs = _token_logprobs(trainer, batches[0])
    recorded = []
    monkeypatch.setattr(trainer.engine, "offload_states", _recording(trainer.engine.offload_states, recorded))
    with monkeypatch.context() as m:
        m.setattr(trainer, "device", torch.device("cuda", 0))
        trainer.offload_state()
    assert _weight_storage(trainer) == storage
    assert all(torch.equal(v, weights[k]) for k, v in trainer.full_state_dict().items())
    assert torch.equal(_token_logprobs(trainer, batches[0]), logprobs)
    assert not trainer.has_optimizer_state and recorded == [list(trainer.idle_offload_states())]
    assert "lp_params" not in recorded[0] and set(trainer.engine.optimizer.offloaded_states) == set(recorded[0])
    metrics.append(trainer.update(batches[1]))  # reloads the state first
    assert trainer.has_optimizer_state and not trainer.engine.optimizer.offloaded_states
    assert_equals_torch_run(trainer, metrics, torch_run)


def _recording(offload_states, calls: list):
    """``engine.offload_states`` recording what it is asked to move. Host buffers are pinned only with a GPU there
    (DeepSpeed 0.19.0 pins with torch, which needs one; later 0.19 releases skip pinning on a CPU accelerator)."""
    def record(include=None, **kwargs):
        calls.append(None if include is None else [str(s.value) for s in include])
        kwargs.setdefault("pin_memory", torch.cuda.is_available())
        return offload_states(include=include, **kwargs)

    return record


# ---------------------------------------------------------------------------------------------- version window
@pytest.mark.parametrize("version", ["0.18.9", "0.15.4", "0.20.0", "1.0.0"])
def test_a_deepspeed_outside_the_tested_window_is_refused_naming_both(version):
    with pytest.raises(RuntimeError, match=re.escape(f"DeepSpeed {version}") + ".*" + re.escape(DEEPSPEED_WINDOW)):
        check_deepspeed_version(version)


def test_the_installed_deepspeed_is_in_the_window():
    check_deepspeed_version("0.19.0")
    check_deepspeed_version("0.19.8")
    check_deepspeed_version()


def test_a_deepspeed_backend_refuses_to_start_with_a_version_outside_the_window(monkeypatch):
    monkeypatch.setattr(deepspeed_backend, "installed_deepspeed_version", lambda: "0.18.9")
    with pytest.raises(RuntimeError, match=r"DeepSpeed 0\.18\.9 is installed"):
        build_trainer(trainer_config(backend="deepspeed_zero2", kl_coef=0.0), tiny_model()[0])


@pytest.mark.parametrize("path", ["pyproject.toml", "environment.yml"])
def test_the_install_files_pin_the_tested_window(path):
    pins = re.findall(r"deepspeed\s*([<>=!~][^\"'\s#]*)", (ROOT / path).read_text())
    assert pins == [DEEPSPEED_WINDOW]


def test_an_old_deepspeed_is_refused_by_the_start_up_checks(monkeypatch, tmp_path):
    """The window is checked with the config, before a model is loaded or a run directory written."""
    from unifiedplayers import models
    from unifiedplayers.config import compose
    from unifiedplayers.loop.outer import OuterLoop
    from unifiedplayers.trainer import deepspeed_backend

    monkeypatch.setattr(deepspeed_backend, "installed_deepspeed_version", lambda: "0.18.9")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(RuntimeError, match="DeepSpeed 0.18.9 is installed"):
        OuterLoop(compose(["experiment=tiny", "trainer=deepspeed_zero2"]), tmp_path)
    assert not any(tmp_path.iterdir())
