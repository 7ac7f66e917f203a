"""DeepSpeed ZeRO-2/3 on CPU (gloo) against the torch backend, and DeepSpeed checkpoints.

One ZeRO-2 engine is shared by the module (DeepSpeed start-up is the slow part); the tests run in file
order on it. DeepSpeed's shared-memory all-reduce op (its inference engine's) is not built: training needs no
C++ op of DeepSpeed's without ZeRO-Offload.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("deepspeed")

from unifiedplayers.trainer import build_trainer  # noqa: E402
from unifiedplayers.trainer.deepspeed_backend import deepspeed_config  # noqa: E402

from tests.trainer.trainer_helpers import (  # noqa: E402
    assert_equals_torch_run,
    synthetic_batch,
    tiny_model,
    torch_reference_run,
    trainer_config,
)

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

STEPS = 2


def _batches(count: int):
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(21)
    return [synthetic_batch(model, g) for _ in range(count)]


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def batches():
    return _batches(STEPS + 1)


@pytest.fixture(scope="module")
def torch_run(batches):
    """The torch backend from the same start: per-step metrics and final weights."""
    return torch_reference_run(batches, STEPS)


@pytest.fixture(scope="module")
def zero2(batches):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(backend="deepspeed_zero2", kl_coef=0.05), model)
    trainer.start_outer_iteration()
    metrics = [trainer.update(b) for b in batches[:STEPS]]
    torch.set_num_threads(before)
    return trainer, metrics


def test_generated_config_has_no_deepspeed_gas_and_our_clip():
    ds = deepspeed_config(trainer_config(grad_clip=0.7, ds_config={"zero_optimization": {"overlap_comm": False}}), 2)
    assert ds["gradient_accumulation_steps"] == 1 and ds["gradient_clipping"] == 0.7
    assert ds["zero_optimization"] == {"stage": 2, "overlap_comm": False}  # ds_config merged, not replaced


def test_deepspeed_builds_no_inference_comm_op(zero2):
    """Its communication backend started without the shared-memory op (DeepSpeed-Inference's all-reduce, JIT-built
    on a CPU otherwise): the steps below reduce through torch.distributed."""
    from deepspeed.comm import comm as ds_comm

    assert ds_comm.cdb is not None and ds_comm.cdb.shm_comm_op is None


def test_zero2_step_equals_torch_step(zero2, torch_run):
    trainer, ds_metrics = zero2
    torch_metrics, torch_params = torch_run
    assert trainer.backend == "deepspeed_zero2"
    for a, b in zip(torch_metrics, ds_metrics):
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=1e-6)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
        assert b["actor/num_micro_batches"] == a["actor/num_micro_batches"] == 3
    assert ds_metrics[-1]["actor/kl"] > 0
    ds_params = _params(trainer.model)
    moved = max(float((torch_params[k] - tiny_model()[0].state_dict()[k]).abs().max()) for k in torch_params)
    assert moved > 1e-4  # the comparison is not vacuous: training moved the weights
    for k, v in torch_params.items():
        torch.testing.assert_close(ds_params[k], v, atol=1e-5, rtol=0)


def test_zero2_checkpoint_round_trip_is_bit_exact(zero2, batches, tmp_path):
    trainer, _ = zero2
    torch.set_num_threads(1)
    trainer.save_checkpoint(tmp_path / "evaluation")
    # The full weights as the torch backend writes them, for the evaluation harness and retention.
    saved = torch.load(tmp_path / "evaluation" / "model.pt", weights_only=True)
    assert saved.keys() == _params(trainer.model).keys()
    assert all(torch.equal(saved[k], v) for k, v in _params(trainer.model).items())
    trainer.update(batches[STEPS])
    after = _params(trainer.model)
    rng_after = torch.rand(2)
    trainer.load_checkpoint(tmp_path / "evaluation")  # rewinds weights, optimizer, scheduler, RNG
    assert trainer.global_step == STEPS
    trainer.update(batches[STEPS])
    assert torch.equal(torch.rand(2), rng_after)
    for k, v in _params(trainer.model).items():
        assert torch.equal(v, after[k]), k


def test_zero3_step_equals_torch_step(batches, torch_run, tmp_path):
    torch.set_num_threads(1)
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(backend="deepspeed_zero3", kl_coef=0.05, ref_mode="precompute"), model)
    trainer.start_outer_iteration()
    assert_equals_torch_run(trainer, [trainer.update(b) for b in batches[:STEPS]], torch_run)
    params = trainer.full_state_dict()
    # Its checkpoint's model.pt holds the gathered weights, not the empty partitions of the module.
    trainer.save_checkpoint(tmp_path / "execution")
    saved = torch.load(tmp_path / "execution" / "model.pt", weights_only=True)
    assert all(torch.equal(saved[k], params[k]) for k in params)


def _rotary_dtypes(model):
    return {n: b.dtype for n, b in model.named_buffers() if n.endswith("inv_freq")}


def test_bf16_engine_keeps_float32_rotary_buffers(batches):
    """DeepSpeed's bf16 mode casts the whole module (``module.bfloat16()``); the backend puts the rotary buffers
    back in float32, as ``from_pretrained(dtype=bf16)`` leaves them, so its log-probs match a bf16 load's."""
    torch.set_num_threads(1)
    model, _ = tiny_model()
    assert set(_rotary_dtypes(model).values()) == {torch.float32}
    trainer = build_trainer(trainer_config(backend="deepspeed_zero2", dtype="bfloat16", kl_coef=0.05), model)
    trainer.start_outer_iteration()
    trainer.update(batches[0])
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    assert set(_rotary_dtypes(trainer.model).values()) == {torch.float32}


def test_the_cpu_adam_op_is_one_unit_that_changes_with_its_sources(tmp_path):
    """load_cpu_adam_op builds DeepSpeed's two CPU Adam sources as one translation unit (torch's headers parsed once).
    The unit includes them in order by absolute path and names their SHA-256, so that a changed source (a DeepSpeed
    upgrade) changes the unit and torch rebuilds the op; an unchanged unit is not written again."""
    import hashlib
    import os

    from unifiedplayers.trainer.deepspeed_backend import cpu_adam_unity_source

    a, b = tmp_path / "src" / "a.cpp", tmp_path / "src" / "b.cpp"
    a.parent.mkdir()
    a.write_text("int a() { return 1; }\n")
    b.write_text("int b() { return 2; }\n")
    unity = cpu_adam_unity_source([str(a), str(b)], tmp_path / "ext")
    text = unity.read_text()
    includes = [line for line in text.splitlines() if line.startswith("#include")]
    assert includes == [f'#include "{a.resolve()}"', f'#include "{b.resolve()}"']
    assert hashlib.sha256(a.read_bytes()).hexdigest() in text and hashlib.sha256(b.read_bytes()).hexdigest() in text
    os.utime(unity, (1, 1))
    assert cpu_adam_unity_source([str(a), str(b)], tmp_path / "ext").stat().st_mtime == 1  # unchanged: not rewritten
    b.write_text("int b() { return 3; }\n")
    assert cpu_adam_unity_source([str(a), str(b)], tmp_path / "ext").read_text() != text
    assert sorted(p.name for p in (tmp_path / "ext").iterdir()) == ["cpu_adam_unity.cpp"]  # no temporary file left
