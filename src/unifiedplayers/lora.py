"""Players as low-rank adapters on one frozen backbone (``trainer.lora.rank`` > 0), through PEFT's LoRA.

The backbone is loaded once, frozen and shared: each player is its own module tree whose frozen tensors *are* the
backbone's (:func:`share_base`), with LoRA layers in ``target_modules`` (:func:`add_adapter`): W x + (α / r) B A x,
B (out × r) zero, so before its first update every player computes what the backbone computes. A player is its
adapter (:func:`adapter_state`): checkpoints, π_ref, stale feedback's copies and the weights sent to a rollout
engine are adapter states. The adapters stay float32 (master weights); the backbone is in the compute dtype.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping, Optional

import torch
from torch import nn

Tensor = torch.Tensor
ADAPTER = "default"  # PEFT's adapter name inside each player's module (one adapter per module)


def enabled(trainer_cfg: Any) -> bool:
    """Whether ``trainer_cfg`` (``cfg.trainer``, or a role's resolved trainer config) trains adapters."""
    lora = getattr(trainer_cfg, "lora", None) if not isinstance(trainer_cfg, Mapping) else trainer_cfg.get("lora")
    return lora is not None and int(lora.get("rank", 0) if isinstance(lora, Mapping) else lora.rank) > 0


def peft_config(lora_cfg: Any) -> Any:
    """PEFT's ``LoraConfig`` of ``trainer.lora`` (rank, alpha, dropout, target modules; no bias trained)."""
    from peft import LoraConfig

    return LoraConfig(r=int(lora_cfg.rank), lora_alpha=float(lora_cfg.alpha), lora_dropout=float(lora_cfg.dropout),
                      target_modules=list(lora_cfg.target_modules), bias="none")


def freeze(model: nn.Module) -> nn.Module:
    """Every parameter of ``model`` frozen: the backbone the players share."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def frozen_tensors(model: nn.Module) -> list[Tensor]:
    """The parameters and buffers of ``model`` that no adapter owns: the shared backbone's."""
    return [*(p for p in model.parameters() if not p.requires_grad), *model.buffers()]


def share_base(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose frozen parameters and buffers are ``model``'s own tensors (one backbone in memory)
    and whose trainable ones (an adapter, if any) are copies."""
    memo = {id(t): t for t in frozen_tensors(model)}
    return copy.deepcopy(model, memo)


def add_adapter(model: nn.Module, lora_cfg: Any, seed: Optional[int] = None) -> nn.Module:
    """``model`` (frozen) with a float32 LoRA adapter injected in place into ``lora_cfg.target_modules``; A drawn
    from ``seed``'s generator when given (without touching the global RNG streams), B zero."""
    from peft import inject_adapter_in_model

    freeze(model)
    no_match = f"trainer.lora.target_modules={list(lora_cfg.target_modules)} matched no layer of {type(model).__name__}"
    state = torch.random.get_rng_state()
    try:
        if seed is not None:
            torch.manual_seed(seed)
        inject_adapter_in_model(peft_config(lora_cfg), model, adapter_name=ADAPTER)
    except ValueError as err:  # PEFT: "Target modules ... not found in the base model"
        raise ValueError(f"{no_match}: {err}") from None
    finally:
        torch.random.set_rng_state(state)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
            p.requires_grad_(True)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(no_match)
    return model


def is_adapted(model: nn.Module) -> bool:
    """Whether ``model`` carries LoRA layers."""
    return any("lora_" in name for name, _ in model.named_parameters())


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for name, p in model.named_parameters() if "lora_" in name]


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapter's tensors of ``model`` by their ``state_dict`` names (views, not copies)."""
    return {name: t for name, t in model.state_dict(keep_vars=False).items() if "lora_" in name}


def policy_state(model: nn.Module) -> dict[str, Tensor]:
    """What defines the player held in ``model``: its adapter where it has one, else all its weights."""
    return adapter_state(model) if is_adapted(model) else model.state_dict()


@torch.no_grad()
def load_policy_state(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """``model``'s weights := ``state`` (:func:`policy_state` of a module of the same structure): an adapter's
    tensors only, every one of them, or a full state dict strictly."""
    if not is_adapted(model):
        model.load_state_dict(state)
        return
    want = set(adapter_state(model))
    if set(state) != want:
        missing, extra = sorted(want - set(state)), sorted(set(state) - want)
        raise ValueError(f"not this player's adapter: missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                         f"unexpected {extra[:3]}{'...' if len(extra) > 3 else ''}")
    model.load_state_dict(state, strict=False)


def adapter_parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in adapter_parameters(model))


def merged_state(model: nn.Module) -> dict[str, Tensor]:
    """The full weights of the player in ``model`` with its adapter folded in (W + (α / r) B A, summed in float32, in
    W's dtype), under the backbone's own names: a plain transformers checkpoint. Read from the state dict alone, so
    the shared backbone is never written (and under ZeRO-3 the gathered values are read)."""
    state = model.state_dict()
    scales = {name: m.scaling[ADAPTER] for name, m in model.named_modules() if ADAPTER in getattr(m, "lora_A", {})}
    out = {}
    for name, t in state.items():
        if "lora_" in name:
            continue
        layer = name.split(".base_layer.")[0]
        if layer in scales and name == f"{layer}.base_layer.weight":
            a, b = state[f"{layer}.lora_A.{ADAPTER}.weight"], state[f"{layer}.lora_B.{ADAPTER}.weight"]
            t = (t.float() + scales[layer] * (b.float() @ a.float())).to(t.dtype)
        out[name.replace(".base_layer.", ".")] = t
    return out


def adapter_rank(model: nn.Module) -> int:
    """r of ``model``'s adapter (the rows of its first A)."""
    return next(int(p.shape[0]) for name, p in model.named_parameters() if "lora_A" in name)


def base_state(model: nn.Module) -> dict[str, Tensor]:
    """The backbone's weights under ``model``, under the backbone's own names (an adapter left out)."""
    if not is_adapted(model):
        return model.state_dict()
    return {name.replace(".base_layer.", "."): t for name, t in model.state_dict().items() if "lora_" not in name}


def adapter_config(model: nn.Module, base_model: Optional[str] = None) -> Any:
    """PEFT's ``LoraConfig`` of the adapter in ``model``, read off its modules."""
    from peft import LoraConfig

    layers = {name.rsplit(".", 1)[-1]: m for name, m in model.named_modules()
              if ADAPTER in getattr(m, "lora_A", {})}  # the adapted projections, by the name PEFT targets them
    rank = adapter_rank(model)
    scaling = next(iter(layers.values())).scaling[ADAPTER]  # α / r
    return LoraConfig(r=rank, lora_alpha=float(scaling * rank), target_modules=sorted(layers), lora_dropout=0.0,
                      bias="none", base_model_name_or_path=base_model)


def save_peft_adapter(model: nn.Module, directory: str, base_model: Optional[str] = None) -> None:
    """``model``'s adapter in PEFT's format in ``directory``: ``adapter_config.json`` (:func:`adapter_config`) and
    ``adapter_model.safetensors``. What ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load."""
    from safetensors.torch import save_file

    adapter_config(model, base_model).save_pretrained(directory)
    save_file(peft_format(model), f"{directory}/adapter_model.safetensors", metadata={"format": "pt"})


def checkpoint_weights(backbone: nn.Module, path: str) -> dict[str, Tensor]:
    """A trainer checkpoint's ``model.pt`` at ``path`` as full weights of ``backbone``'s architecture: the state dict,
    or its adapter folded into ``backbone`` (settings from the ``adapter_config.json`` beside it). For eval and the
    probes, whose engines sample plain modules."""
    from pathlib import Path

    from peft import LoraConfig

    state = torch.load(path, map_location=next(backbone.parameters()).device, weights_only=True)
    if not any("lora_" in k for k in state):
        return state
    config_dir = Path(path).parent
    if not (config_dir / "adapter_config.json").is_file():
        raise ValueError(f"{path} holds an adapter but {config_dir} no adapter_config.json (its rank, alpha, targets)")
    config = LoraConfig.from_pretrained(str(config_dir))
    settings = {"rank": config.r, "alpha": config.lora_alpha, "dropout": 0.0,
                "target_modules": sorted(config.target_modules)}
    player = add_adapter(share_base(freeze(backbone)), _Settings(settings))
    load_policy_state(player, state)
    return merged_state(player)


class _Settings(dict):
    """``trainer.lora``'s fields as attributes, for :func:`add_adapter` outside a composed config."""

    __getattr__ = dict.__getitem__


def peft_format(model: nn.Module) -> dict[str, Tensor]:
    """The adapter of ``model`` under the names PEFT saves and loads (``adapter_model.safetensors``:
    ``base_model.model.<module>.lora_A.weight``), contiguous float32 copies."""
    marker = f".{ADAPTER}."
    return {"base_model.model." + name.replace(marker, "."): t.detach().float().contiguous().clone()
            for name, t in adapter_state(model).items()}
