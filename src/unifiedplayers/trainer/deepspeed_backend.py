"""DeepSpeed ZeRO-2 / ZeRO-3 backends of :class:`~unifiedplayers.trainer.base.BaseTrainer`.

Same update as the torch backend (:mod:`unifiedplayers.trainer.player_trainer`; the two import only the
interface, :mod:`unifiedplayers.trainer.base`, never each other); DeepSpeed owns backward, gradient
clipping, the optimizer step and checkpoint files. DeepSpeed's gradient accumulation count stays 1; we
call ``backward`` once per micro-batch without its 1/gas scaling (our Eq. 21 weights already sum to 1 over
the batch), mark only the last micro-batch as the accumulation boundary
(``set_gradient_accumulation_boundary``) and call ``step`` once per update, whatever the number of
micro-batches. The engine wraps
:class:`~unifiedplayers.trainer.logprobs.TokenLogprobModel`, so every forward goes through
``engine.forward``: ZeRO-3 advances its micro-step counter there, and without it each micro-batch's
gradient would overwrite the previous one instead of accumulating.

Data-parallel ranks (torchrun): the engine joins the process group of
:func:`~unifiedplayers.distributed.init_distributed` and its data-parallel group is all the ranks. It
*averages* gradients over them, while our per-micro-batch losses carry the whole batch's Eq. 21 weights
(their sum over the ranks is the batch gradient), so each loss is scaled by the world size before
``backward``: the N-rank step equals the 1-rank step on the same batch. Every forward (ZeRO-3 gathers
parameters) and backward (gradient reduction hooks) is a collective, so the ranks run equal numbers of
micro-batches (``lockstep_micro_batches``), and checkpoints are written by every rank into one directory
(``collective_checkpoint``: each rank's optimizer partition). Under ZeRO-3 reading the full weights
(:meth:`gathered_weights`, :meth:`full_state_dict`) is a collective too.

Runs on CPU (gloo + DeepSpeed's ``deepspeed_shm_comm`` extension) as well as on GPUs. A single process
without a launcher gets MASTER_ADDR/PORT, RANK, LOCAL_RANK and WORLD_SIZE defaults. The extension is
JIT-built once (about a minute) into ``TORCH_EXTENSIONS_DIR``, which defaults to
``~/.cache/unifiedplayers/torch_extensions`` so later runs reuse it.
"""
from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any, ContextManager, Mapping

import torch
from torch import nn

from unifiedplayers.trainer.base import BaseTrainer, make_optimizer, make_scheduler, register_trainer_backend
from unifiedplayers.trainer.logprobs import TokenLogprobModel
from unifiedplayers.models import float32_buffers, restore_buffers
from unifiedplayers.trainer.precision import resolve_setting

Tensor = torch.Tensor

DEFAULT_EXTENSIONS_DIR = Path("~/.cache/unifiedplayers/torch_extensions").expanduser()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_single_process_env() -> None:
    """Give a launcher-less process the rendezvous variables torch.distributed needs (world size 1)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(DEFAULT_EXTENSIONS_DIR))
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def deepspeed_config(cfg, stage: int, dtype: str | None = None) -> dict[str, Any]:
    """The DeepSpeed config generated from :class:`~unifiedplayers.config.TrainerConfig`; ``dtype``: the trainer's
    resolved compute dtype (default: ``cfg.dtype``, ``auto`` resolved on this machine's device)."""
    micro = cfg.micro_batch_size if cfg.grad_accum_steps <= 0 else 1
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    dtype = dtype or resolve_setting(cfg.dtype, "cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "bfloat16":
        ds["bf16"] = {"enabled": True}
    elif dtype == "float16":
        ds["fp16"] = {"enabled": True}
    if cfg.offload_optimizer:
        ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    return _merge(ds, cfg.ds_config or {})


class DeepSpeedTrainer(BaseTrainer):
    """ZeRO-``stage`` trainer; see :class:`~unifiedplayers.trainer.base.BaseTrainer` for the interface."""

    stage = 2
    lockstep_micro_batches = True
    collective_checkpoint = True

    @property
    def backend(self) -> str:  # type: ignore[override]
        return f"deepspeed_zero{self.stage}"

    def _setup(self, model: nn.Module) -> None:
        ensure_single_process_env()
        import deepspeed

        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        optimizer = make_optimizer(self.cfg, model)
        buffers = float32_buffers(model)  # bf16 mode casts the whole module, rotary inv_freq included
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=TokenLogprobModel(model, self.cfg.temperature, self.cfg.logprob_chunk_rows),
            optimizer=optimizer,
            lr_scheduler=lambda opt: make_scheduler(self.cfg, opt),
            config=deepspeed_config(self.cfg, self.stage, str(self.compute_dtype).removeprefix("torch.")),
        )
        restore_buffers(self.engine.module.lm, buffers)
        self.device = self.engine.device
        self._offloaded = False

    @property
    def model(self) -> nn.Module:
        return self.engine.module.lm

    def _forward_module(self):
        return self.engine

    def _ensure_optimizer(self) -> None:
        if self._offloaded:
            self.engine.reload_states()
            self._offloaded = False

    def _zero_grad(self) -> None:
        self._ensure_optimizer()
        self.engine.zero_grad()

    def _backward(self, loss: Tensor) -> None:
        # x N: the engine averages the ranks' gradients, the batch gradient is their sum.
        self.engine.backward(loss * self.dist.world_size, scale_wrt_gas=False)

    def _reduce_gradients(self) -> None:
        """Nothing to do: the engine reduces the gradients in its backward hooks and at the boundary."""

    def _set_accumulation_boundary(self, is_last_micro_batch: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(is_last_micro_batch)

    def _step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def current_lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def gathered_weights(self) -> ContextManager[None]:
        if self.stage != 3:
            return contextlib.nullcontext()  # ZeRO-2 keeps the full weights on every rank
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None)

    def _load_policy_weights(self, state: Mapping[str, Tensor]) -> None:
        # Only used to swap the reference in and out for ref_mode=precompute.
        module = self.model
        if self.stage == 3:
            import deepspeed

            params = list(module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0), torch.no_grad():
                module.load_state_dict(state)
        else:
            with torch.no_grad():
                module.load_state_dict(state)

    def _save_backend(self, directory: Path) -> None:
        self._ensure_optimizer()
        self.engine.save_checkpoint(str(directory / "deepspeed"), tag="state", save_latest=False)
        # Also the full weights as the torch backend writes them (model.pt, on the host): what the
        # evaluation harness and the retention policy read, whatever the backend. Every rank is here
        # (a collective checkpoint), so ZeRO-3 can gather its partitions; rank 0 writes.
        with self.gathered_weights():
            if self.dist.is_main:
                torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, directory / "model.pt")

    def _load_backend(self, directory: Path) -> None:
        self._ensure_optimizer()
        path, _ = self.engine.load_checkpoint(
            str(directory / "deepspeed"), tag="state", load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory / 'deepspeed'}")

    def offload_state(self) -> None:
        """Move the ZeRO optimizer state (and fp32 master weights) off the accelerator. On a CPU-only
        machine it already lives in host memory, so there is nothing to move."""
        if self._offloaded or self.device.type == "cpu":
            return
        self.engine.offload_states()
        self._offloaded = True

    @property
    def has_optimizer_state(self) -> bool:
        return not self._offloaded


@register_trainer_backend("deepspeed_zero2")
class DeepSpeedZero2Trainer(DeepSpeedTrainer):
    stage = 2


@register_trainer_backend("deepspeed_zero3")
class DeepSpeedZero3Trainer(DeepSpeedTrainer):
    stage = 3
