"""DeepSpeed ZeRO-2 / ZeRO-3 backends of :class:`~unifiedplayers.trainer.base.BaseTrainer`: DeepSpeed owns backward,
gradient clipping, the optimizer step and checkpoint files.

The engine's gradient accumulation count stays 1: ``backward`` runs once per micro-batch without its 1/gas scaling
(the Eq. 21 weights already sum to 1 over the batch), only the last micro-batch is the accumulation boundary, and
``step`` runs once per update. The engine wraps :class:`~unifiedplayers.trainer.logprobs.TokenLogprobModel`, so every
forward goes through ``engine.forward``, where ZeRO-3 advances its micro-step counter (without it each micro-batch's
gradient would overwrite the last). The engine averages gradients over the ranks, so each loss is scaled by the world
size (:meth:`DeepSpeedTrainer._backward`). DeepSpeed's C++ ops are JIT-built into ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/unifiedplayers/torch_extensions``).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import socket
from pathlib import Path
from typing import Any, ContextManager, Mapping, Sequence

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from torch import nn

from unifiedplayers.rundir import DEEPSPEED
from unifiedplayers.trainer.backends import register_trainer_backend
from unifiedplayers.lora import is_adapted, load_policy_state, policy_state
from unifiedplayers.trainer.base import BaseTrainer
from unifiedplayers.trainer.logprobs import TokenLogprobModel
from unifiedplayers.trainer.offload import ParkedStorages
from unifiedplayers.trainer.optim import make_optimizer, make_scheduler, optimizer_param_groups
from unifiedplayers.models import float32_buffers, restore_buffers
from unifiedplayers.trainer.precision import resolve_setting

Tensor = torch.Tensor

DEFAULT_EXTENSIONS_DIR = Path("~/.cache/unifiedplayers/torch_extensions").expanduser()

# Lower bound: offload_states with ZeRO-Offload (DeepSpeed PR #7979, first in 0.19.0; before it the engine
# asserts). Upper bound: the next minor, not tested. The same pin is in pyproject.toml and environment.yml.
DEEPSPEED_WINDOW = ">=0.19.0,<0.20"


def installed_deepspeed_version() -> str:
    """The installed DeepSpeed's version (from its package metadata: nothing imported)."""
    return importlib.metadata.version("deepspeed")


def check_deepspeed_version(version: str | None = None) -> None:
    """Refuse a DeepSpeed outside :data:`DEEPSPEED_WINDOW` (``version``: default, the installed one)."""
    version = version or installed_deepspeed_version()
    if Version(version) not in SpecifierSet(DEEPSPEED_WINDOW):
        raise RuntimeError(f"DeepSpeed {version} is installed; the DeepSpeed backends are tested with "
                           f"deepspeed{DEEPSPEED_WINDOW}: pip install 'deepspeed{DEEPSPEED_WINDOW}'")


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


def offloads_optimizer(ds: Mapping[str, Any]) -> bool:
    """Whether DeepSpeed config ``ds`` keeps the optimizer state on the host (ZeRO-Offload, to CPU or NVMe)."""
    offload = ds.get("zero_optimization", {}).get("offload_optimizer") or {}
    return offload.get("device", "none") in ("cpu", "nvme")


def skip_inference_comm_op() -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce op on a CPU: only DeepSpeed-Inference calls it;
    training reduces through torch.distributed."""
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


def load_cpu_adam_op() -> Any:
    """DeepSpeed's CPU Adam op, JIT-built on first use without ``-g`` as one translation unit
    (:func:`cpu_adam_unity_source`; benchmarks/README.md, "Building DeepSpeed's CPU Adam op")."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(DEFAULT_EXTENSIONS_DIR))
    from deepspeed.ops.op_builder import CPUAdamBuilder

    builder = CPUAdamBuilder()
    cxx_args, sources = builder.cxx_args, [builder.deepspeed_src_path(p) for p in builder.sources()]
    builder.cxx_args = lambda: [arg for arg in cxx_args() if arg != "-g"]
    unity = cpu_adam_unity_source(sources, Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    builder.sources = lambda: [str(unity)]
    return builder.load()


def cpu_adam_unity_source(sources: Sequence[str], directory: Path) -> Path:
    """``directory/cpu_adam_unity.cpp``, including ``sources`` in order and naming their SHA-256 (torch rebuilds an
    op only when a listed source changes); written atomically, and only when it differs."""
    lines = ["// DeepSpeed's CPU Adam op as one translation unit (unifiedplayers.trainer.deepspeed_backend)."]
    for source in sources:
        digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
        lines += [f"// sha256 {digest}", f'#include "{Path(source).resolve()}"']
    text = "\n".join(lines) + "\n"
    path = directory / "cpu_adam_unity.cpp"
    if not path.is_file() or path.read_text() != text:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".cpu_adam_unity.cpp.tmp-{os.getpid()}"
        tmp.write_text(text)
        tmp.replace(path)
    return path


def make_ds_optimizer(cfg, model: nn.Module, ds: Mapping[str, Any]) -> torch.optim.Optimizer:
    """The optimizer handed to ``deepspeed.initialize``: under ZeRO-Offload, DeepSpeed's CPU Adam in AdamW mode (it
    refuses a torch optimizer there), else :func:`make_optimizer`'s."""
    if not offloads_optimizer(ds):
        return make_optimizer(cfg, model)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    load_cpu_adam_op()
    return DeepSpeedCPUAdam(optimizer_param_groups(cfg, model), lr=cfg.lr, betas=tuple(cfg.betas),
                            eps=cfg.adam_eps, adamw_mode=True)


# The engine's states (deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum) offload_state() may move.
# Never "lp_params": they are the weights every player samples from, its co-players in every block and
# itself in its own (ZeRO-2 re-points them into a host buffer, ZeRO-3 moves their partitions).
_ZERO2_STATES = ("optim_states", "hp_params", "lp_grads")
_ZERO3_STATES = ("optim_states", "hp_params", "lp_grads", "contiguous_grad_buffer")
_ON_HOST_UNDER_OFFLOAD = {2: ("optim_states", "hp_params"), 3: ("optim_states", "hp_params", "lp_grads")}


def states_to_offload(stage: int, cpu_optimizer: bool, optimizer: str) -> tuple[str, ...]:
    """What an idle player's engine moves to the host (``offload_states(include=...)``), as DeepSpeed allows: not what
    ZeRO-Offload keeps there already; under ZeRO-3 optimizer state and master weights of ``FusedAdam`` only."""
    states = _ZERO3_STATES if stage == 3 else _ZERO2_STATES
    if cpu_optimizer:
        return tuple(s for s in states if s not in _ON_HOST_UNDER_OFFLOAD[stage])
    if stage == 3 and optimizer != "FusedAdam":
        return tuple(s for s in states if s not in ("optim_states", "hp_params"))
    return states


class DeepSpeedTrainer(BaseTrainer):
    """ZeRO-``stage`` trainer; see :class:`~unifiedplayers.trainer.base.BaseTrainer` for the interface."""

    stage = 2
    lockstep_micro_batches = True
    collective_checkpoint = True

    @property
    def backend(self) -> str:  # type: ignore[override]
        return f"deepspeed_zero{self.stage}"

    def _setup(self, model: nn.Module) -> None:
        check_deepspeed_version()
        ensure_single_process_env()
        import deepspeed

        skip_inference_comm_op()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        config = deepspeed_config(self.cfg, self.stage, str(self.compute_dtype).removeprefix("torch."))
        buffers = float32_buffers(model)  # bf16 mode casts the whole module, rotary inv_freq included
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=TokenLogprobModel(model, self.cfg.temperature, self.cfg.logprob_chunk_rows),
            optimizer=make_ds_optimizer(self.cfg, model, config),
            lr_scheduler=lambda opt: make_scheduler(self.cfg, opt),
            config=config,
        )
        restore_buffers(self.engine.module.lm, buffers)
        self.device = self.engine.device
        self._offloaded = False  # engine.offload_states() moved the idle states off the accelerator
        self._parked: ParkedStorages | None = None  # the optimizer's host tensors while idle

    @property
    def model(self) -> nn.Module:
        return self.engine.module.lm

    def _forward_module(self):
        return self.engine

    def _ensure_optimizer(self) -> None:
        self._check_not_finished()
        if self._parked is not None:
            self._parked.restore()
            self._parked = None
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

    def gathered_weights(self, modifier_rank: int | None = None) -> ContextManager[None]:
        """ZeRO-3: a collective gathering the full weights (``modifier_rank``: whose changes are partitioned back after
        it). ZeRO-2 keeps the full weights on every rank."""
        if self.stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=modifier_rank)

    @property
    def _holds_reference(self) -> bool:
        """ZeRO-3 swaps π_ref in from rank 0 (:meth:`_load_policy_weights`): only rank 0 keeps it."""
        return self.stage != 3 or self.cfg.ref_mode != "precompute" or self.dist.is_main

    def _load_policy_weights(self, state: Mapping[str, Tensor] | None) -> None:
        # Swaps π_ref in and out (ref_mode=precompute). ZeRO-3: every rank takes part, rank 0's weights are
        # partitioned to all (the others pass None).
        with self.gathered_weights(modifier_rank=0), torch.no_grad():
            if state is not None:
                load_policy_state(self.model, state)

    def _save_backend(self, directory: Path) -> None:
        self._ensure_optimizer()
        # An adapter player (trainer.lora): its adapter and its optimizer state, not the frozen backbone it shares.
        self.engine.save_checkpoint(str(directory / DEEPSPEED), tag="state", save_latest=False,
                                    exclude_frozen_parameters=is_adapted(self.model))
        with self.gathered_weights():  # model.pt too, on the host, by rank 0
            if self.dist.is_main:
                self._save_weights(directory, {k: v.detach().cpu() for k, v in policy_state(self.model).items()})

    def _load_backend(self, directory: Path) -> None:
        self._ensure_optimizer()
        path, _ = self.engine.load_checkpoint(
            str(directory / DEEPSPEED), tag="state", load_optimizer_states=True, load_lr_scheduler_states=True,
            load_module_strict=not is_adapted(self.model),  # an adapter's checkpoint holds no frozen backbone
        )
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory / 'deepspeed'}")

    def _offload_optimizer(self, keep: bool = True) -> None:
        """Move :func:`states_to_offload` to the host, then park the optimizer's host tensors in a file without a name;
        the weights stay. On a CPU the host is the device: only ZeRO-3's gradient bucket is let go."""
        if self._offloaded or self._parked is not None:
            return
        include = self.idle_offload_states()
        if self.device.type == "cpu":
            include = tuple(s for s in include if s == "contiguous_grad_buffer")
        if include:
            from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

            self.engine.offload_states(include=[OffloadStateTypeEnum(s) for s in include], pin_memory=False)
        self._offloaded = bool(include) or self.device.type != "cpu"
        self._parked = ParkedStorages(self.host_optimizer_tensors(), self._offload_dir(), keep=self._weights(),
                                      contents=keep)

    def host_optimizer_tensors(self) -> list[Tensor]:
        """The tensors the engine's ZeRO optimizer and its basic optimizer hold (what an idle player parks, the
        weights aside)."""
        zero = self.engine.optimizer
        basic = getattr(zero, "optimizer", None)
        out = [t for value in vars(zero).values() for t in _tensors(value)]
        if basic is not None and basic is not zero:
            out += list(_tensors(list(basic.state.values())))
        return out

    def _weights(self) -> list[Tensor]:
        """What the player samples from: the module's parameters and buffers, and (ZeRO-3) their partitions."""
        module = self.model
        out = list(module.parameters()) + list(module.buffers())
        return out + [p.ds_tensor for p in module.parameters() if hasattr(p, "ds_tensor")]

    def idle_offload_states(self) -> tuple[str, ...]:
        """The engine states :meth:`offload_state` moves to the host (:func:`states_to_offload`)."""
        return states_to_offload(self.stage, self.engine.zero_use_cpu_optimizer(),
                                 type(self.engine.basic_optimizer).__name__)

    @property
    def has_optimizer_state(self) -> bool:
        return not self._offloaded and self._parked is None

    @property
    def parked_optimizer_bytes(self) -> int:
        """Bytes of the optimizer's host tensors parked in a file while the player is idle (0: none parked)."""
        return self._parked.nbytes if self._parked is not None else 0


def _tensors(value: Any, depth: int = 3):
    """The tensors in ``value`` (a tensor, or lists, tuples and dicts of them, ``depth`` deep) and their gradients."""
    if isinstance(value, torch.Tensor):
        yield value
        if value.is_leaf and value.grad is not None:
            yield value.grad
    elif depth > 0 and isinstance(value, (list, tuple, dict)):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _tensors(v, depth - 1)


@register_trainer_backend("deepspeed_zero2")
class DeepSpeedZero2Trainer(DeepSpeedTrainer):
    stage = 2


@register_trainer_backend("deepspeed_zero3")
class DeepSpeedZero3Trainer(DeepSpeedTrainer):
    stage = 3
