"""The plain torch backend of :class:`~unifiedplayers.trainer.base.BaseTrainer` (Appendix B.3): one process, CPU or
one GPU, float32 master weights with lower-precision copies (:mod:`~unifiedplayers.trainer.precision`), AdamW created
lazily, ``model.pt`` / ``optimizer.pt`` checkpoint files.
"""
from __future__ import annotations

import copy
import shutil
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Optional

import torch
from torch import nn

from unifiedplayers.rundir import MODEL_WEIGHTS, OPTIMIZER
from unifiedplayers.trainer.backends import register_trainer_backend
from unifiedplayers.trainer.base import BaseTrainer
from unifiedplayers.lora import is_adapted, load_policy_state, policy_state
from unifiedplayers.trainer.logprobs import TokenLogprobModel
from unifiedplayers.trainer.offload import ParkedTensors, offload_file
from unifiedplayers.trainer.optim import make_optimizer, make_scheduler
from unifiedplayers.trainer.precision import cast_parameters, copy_weights, move_gradients

Tensor = torch.Tensor


class HeldWeights(NamedTuple):
    """A torch-backend player's weights as it holds them now (:attr:`TorchTrainer.held_weights`): read them, never
    change the trainer through them."""

    masters: nn.Module  # the float32 master weights
    copies: Mapping[torch.dtype, nn.Module]  # their copies in lower precisions (compute, sampling), read-only


@register_trainer_backend("torch")
class TorchTrainer(BaseTrainer):
    """GRPO trainer of one player, plain torch backend (its use: :class:`~unifiedplayers.trainer.base.BaseTrainer`)."""

    backend = "torch"

    def _prepare_model(self, model: nn.Module) -> nn.Module:
        """Master weights in float32, in memory of their own (not a safetensors mapping); an adapter player as it is."""
        if is_adapted(model):
            return model
        model = cast_parameters(model, torch.float32)
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                if t.device.type == "cpu" and t.numel() and not t.untyped_storage().resizable():
                    t.data = t.data.clone()
        return model

    def _setup(self, model: nn.Module) -> None:
        self._model = model
        self._adapted = is_adapted(model)  # trainer.lora: the master weights are the adapter's
        self._copies: dict[torch.dtype, nn.Module] = {}  # the weights in lower precisions, refreshed after each step
        self._sampled_dtypes: set[torch.dtype] = set()  # the dtypes sampling_model() handed out
        self._masters_parked: Optional[ParkedTensors] = None  # the float32 master weights while idle
        self._logprob_model = TokenLogprobModel(self.compute_model, self.cfg.temperature, self.cfg.logprob_chunk_rows)
        self.device = next(model.parameters()).device
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.scheduler = None
        self._offloaded_to: Optional[Any] = None  # the unnamed file of offload_state()

    @property
    def model(self) -> nn.Module:
        """The policy's master weights (float32) as a plain transformers module (for export and checkpoints); an idle
        player's parked masters come back first."""
        self._restore_masters()
        return self._model

    @property
    def held_weights(self) -> HeldWeights:
        """The master weights and their lower-precision copies as held now, for measurements: unlike :attr:`model`,
        an idle player's parked masters are not brought back (their tensors are empty while parked)."""
        return HeldWeights(self._model, MappingProxyType(self._copies))

    @property
    def compute_model(self) -> nn.Module:
        """The master weights in float32; under mixed precision, their copy in ``trainer.dtype``."""
        return self._weights_in(self.compute_dtype)

    def sampling_model(self, dtype: torch.dtype) -> nn.Module:
        """The policy in ``dtype``: the master weights for float32, else a copy refreshed after each optimizer step
        (the compute copy when the dtypes agree: one bf16 copy serves training and rollouts)."""
        self._sampled_dtypes.add(dtype)
        return self._weights_in(dtype)

    def _weights_in(self, dtype: torch.dtype) -> nn.Module:
        if dtype == torch.float32 or self._adapted:  # an adapter player: one module computes and samples
            return self.model
        if dtype not in self._copies:
            grads = dtype == self.compute_dtype
            self._copies[dtype] = cast_parameters(copy.deepcopy(self.model), dtype).requires_grad_(grads)
        return self._copies[dtype]

    def _sync_copies(self) -> None:
        for module in self._copies.values():
            copy_weights(self._model, module)

    def _forward_module(self) -> nn.Module:
        return self._logprob_model

    def _ensure_optimizer(self) -> None:
        """Create AdamW lazily: a player that is never updated holds no optimizer state."""
        self._restore_masters()
        if self.optimizer is None:
            self.optimizer = make_optimizer(self.cfg, self._model)
            self.scheduler = make_scheduler(self.cfg, self.optimizer)
            if self._offloaded_to is not None:
                self._offloaded_to.seek(0)
                self._load_optimizer_state(self._offloaded_to)
                self._offloaded_to.close()
                self._offloaded_to = None

    def _optimizer_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def _load_optimizer_state(self, file: Any) -> None:
        state = torch.load(file, map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def _zero_grad(self) -> None:
        self._ensure_optimizer()
        self.optimizer.zero_grad(set_to_none=True)

    def _backward(self, loss: Tensor) -> None:
        loss.backward()
        if self.compute_dtype != torch.float32 and not self._adapted:  # the copy's gradients join the float32 master's
            move_gradients(self.compute_model, self._model)

    def _reduce_gradients(self) -> None:
        self.dist.all_reduce_gradients(list(self._model.parameters()))

    def _step(self) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self._model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else self.cfg.lr

    def _load_policy_weights(self, state: Mapping[str, Tensor]) -> None:
        load_policy_state(self.model, state)
        self._sync_copies()

    def _save_backend(self, directory: Path) -> None:
        self._save_weights(directory, policy_state(self.model))
        if self._offloaded_to is not None:  # offloaded: same file format, copy it and keep memory free
            self._offloaded_to.seek(0)
            with open(directory / OPTIMIZER, "wb") as out:
                shutil.copyfileobj(self._offloaded_to, out)
        elif self.optimizer is not None:
            torch.save(self._optimizer_state(), directory / OPTIMIZER)

    def _load_backend(self, directory: Path) -> None:
        state = torch.load(directory / MODEL_WEIGHTS, map_location=self.device, weights_only=True)
        self._load_policy_weights(state)
        if self._offloaded_to is not None:
            self._offloaded_to.close()
        self.optimizer, self.scheduler, self._offloaded_to = None, None, None
        if (directory / OPTIMIZER).exists():
            self._ensure_optimizer()
            self._load_optimizer_state(directory / OPTIMIZER)

    def _offload_optimizer(self, keep: bool = True) -> None:
        """AdamW's state to a file without a name; the float32 master weights follow it when the player neither
        samples nor computes with them."""
        if self.optimizer is not None and not keep:
            self.optimizer, self.scheduler = None, None
        if self.optimizer is not None:
            fh = offload_file(self._offload_dir())
            torch.save(self._optimizer_state(), fh)
            fh.flush()
            self.optimizer, self.scheduler = None, None
            self._offloaded_to = fh
        if (self._masters_parked is None and self.compute_dtype != torch.float32 and not self._adapted
                and torch.float32 not in self._sampled_dtypes):
            self._masters_parked = ParkedTensors(self._model.parameters(), self._offload_dir(), contents=keep)

    def _restore_masters(self) -> None:
        if self._masters_parked is not None:
            if self._finished and self._masters_parked.freed_unwritten:
                raise RuntimeError(f"the {self.role} player's float32 master weights were freed after its last "
                                   "update of the run; its checkpoint's model.pt holds them")
            self._masters_parked.restore()
            self._masters_parked = None

    @property
    def has_optimizer_state(self) -> bool:
        return self.optimizer is not None and len(self.optimizer.state) > 0
