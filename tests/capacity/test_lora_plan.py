"""The capacity plan of adapter players (``trainer.lora.rank`` > 0) and of a sleeping vLLM engine
(``rollout.sleep_level``): one backbone for the three players, an adapter each, the active adapter's gradients and
AdamW state alone; vLLM's budget only in the generation instant while it sleeps; the counts are those of the modules
the code builds; ``experiment=one_gpu`` fits one 24 GB GPU and its full-parameter twin does not."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from unifiedplayers import lora
from unifiedplayers.capacity import CapacityError, GiB, Hardware, check_fits, model_arch, plan, setup_of
from unifiedplayers.capacity.report import main
from unifiedplayers.config import LoraSettings, compose

pytestmark = pytest.mark.cpu

ONE_GPU = Hardware(gpus=1, gpu_memory=24 * GiB, host_ram=64 * GiB, name="one 24 GiB GPU")


def test_the_plans_adapter_is_the_one_the_code_builds():
    """The tiny model of experiment=tiny and the Qwen3-1.7B shape (built on the meta device from its arch file): the
    plan's parameters per adapter and per backbone equal those of the modules the trainer holds."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = compose(["experiment=tiny", "trainer.lora.rank=4"])
    from unifiedplayers.models import load_model

    base, _ = load_model(cfg.model)
    player = lora.add_adapter(lora.share_base(lora.freeze(base)), cfg.trainer.lora)
    s = setup_of(cfg, Hardware())
    assert s.adapter == lora.adapter_parameter_count(player) > 0
    assert s.n == sum(p.numel() for p in base.parameters())
    one = compose(["experiment=one_gpu"])
    arch = model_arch(one.model)
    fields = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(arch.source)).items() if not k.startswith("_")}
    with torch.device("meta"):
        shaped = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
    lora.add_adapter(shaped, one.trainer.lora)
    assert setup_of(one, ONE_GPU).adapter == lora.adapter_parameter_count(shaped) == 17_432_576
    assert arch.parameters == sum(p.numel() for n, p in shaped.named_parameters() if "lora_" not in n)


def test_one_backbone_adapters_and_only_the_active_adapters_state():
    full = plan(compose(["experiment=one_gpu", "trainer.lora.rank=0"]), ONE_GPU)
    mine = plan(compose(["experiment=one_gpu"]), ONE_GPU)
    s = setup_of(compose(["experiment=one_gpu"]), ONE_GPU)
    items = {i.name: i.bytes for i in mine.gpu_peak.items}
    assert items["the backbone's weights, one copy the 3 players share (1.72B x 16-bit)"] == 2 * s.n
    assert items["3 players' adapters (17.4M x fp32 each)"] == 3 * 4 * s.adapter
    assert items["active adapter's AdamW state (2 x fp32)"] == 8 * s.adapter
    assert not any("master" in name or "players' weights" in name for name in items)
    assert [i.bytes for i in mine.checkpoint] == [4 * s.adapter, 8 * s.adapter, 4 * s.adapter]
    assert mine.gpu_peak.total < full.gpu_peak.total / 2
    # backward: no weight gradient of the frozen LM head, and 2 forwards' FLOPs per trained row, not 3
    assert mine.roles["execution"].training_flops == pytest.approx(2 / 3 * full.roles["execution"].training_flops)


def test_a_sleeping_engine_is_in_the_generation_instant_only():
    awake = plan(compose(["experiment=one_gpu", "rollout.sleep_level=0"]), ONE_GPU)
    asleep = plan(compose(["experiment=one_gpu"]), ONE_GPU)
    vllm = lambda instant: sum(i.bytes for i in instant.items if i.name.startswith("vLLM"))  # noqa: E731
    budget = 0.6 * 24 * GiB
    for a, b in zip(awake.gpu, asleep.gpu):
        assert a.name == b.name
        if a.name == "generation":
            assert vllm(a) == vllm(b) == pytest.approx(budget)
        else:
            assert vllm(a) == pytest.approx(budget) and vllm(b) == 0
            assert any(i.name.startswith("vLLM asleep: 14.4 GiB freed") for i in b.items)
    assert any(i.name.startswith("vLLM's weights on the host") for i in asleep.host_peak.items)


def test_one_gpu_fits_24_gb_and_its_full_parameter_twin_is_refused(capsys):
    check_fits(plan(compose(["experiment=one_gpu"]), ONE_GPU), ONE_GPU)
    with pytest.raises(CapacityError, match="GPU memory per GPU"):
        check_fits(plan(compose(["experiment=one_gpu", "trainer.lora.rank=0"]), ONE_GPU), ONE_GPU)
    assert main(["experiment=one_gpu"]) == 0  # make plan EXP=one_gpu: the preset's machine (capacity.machine)
    out = capsys.readouterr().out
    assert "Hardware: 1 x 24 GiB GPU" in out and "vLLM sleeps through the trainer's passes" in out


def test_an_adapter_on_a_projection_the_plan_does_not_know_is_refused():
    cfg = compose(["experiment=one_gpu", "trainer.lora.target_modules=[q_proj,lm_head]"])
    with pytest.raises(ValueError, match="lm_head"):
        plan(cfg, ONE_GPU)
    assert LoraSettings().rank == 0  # the paper presets train every parameter
    assert compose(["experiment=paper_qwen3_4b"]).trainer.lora.rank == 0


def test_the_plans_vllm_adapter_count_is_the_engines():
    from unifiedplayers.capacity.memory import VLLM_MAX_LORAS
    from unifiedplayers.rollout.vllm_engine import MAX_LORAS

    assert VLLM_MAX_LORAS == MAX_LORAS
