"""The trainer of one player (§3.3, Appendix B.3): :class:`BaseTrainer`, the GRPO update every backend shares, and the
hooks a backend supplies (the methods that raise ``NotImplementedError``; backends import this module, never each
other).

One :meth:`BaseTrainer.update` is one optimizer step: the micro-batches of
:func:`~unifiedplayers.trainer.batching.plan_micro_batches` (Eq. 21 weights from the whole batch), the loss of
:mod:`unifiedplayers.trainer.grpo`, then AdamW with gradient clipping. π_ref (Eq. 20) is a frozen copy of the weights
at the outer iteration's start (``ref_mode: copy``) or those weights swapped in once per batch (``precompute``).
Data-parallel ranks each receive the whole batch, run the micro-batches ``i`` with ``i mod N = rank`` and sum their
gradients before the step, so every rank takes the step of the whole batch.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import os
import tempfile
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ContextManager, Iterable, Mapping, NamedTuple, Optional, Sequence

import torch
from torch import nn

import unifiedplayers.trainer.grpo as grpo
from unifiedplayers.distributed import SINGLE, DistContext
from unifiedplayers.lora import (adapter_config, adapter_parameters, is_adapted, load_policy_state, policy_state,
                                 share_base)
from unifiedplayers.rundir import MODEL_WEIGHTS, REFERENCE, RNG_STATE, TRAINER_STATE
from unifiedplayers.trainer.batching import MicroBatchPlan, _as_tensor, _combine_metrics, _MicroBatch, plan_micro_batches
from unifiedplayers.trainer.checkpoint import atomic_directory, capture_rng_state, restore_rng_state
from unifiedplayers.trainer.diagnostics import EntropyRetention, grad_norm_block_stats
from unifiedplayers.trainer.entropy import shared_mean_token_entropy
from unifiedplayers.trainer.logprobs import TokenLogprobModel, TokenLogprobs, eval_mode
from unifiedplayers.trainer.offload import ParkedTensors
from unifiedplayers.trainer.precision import cast_parameters, logprob_mismatch, resolve_setting
from unifiedplayers.trainer.sample import TrainSample, as_sample

Tensor = torch.Tensor

class HeldReference(NamedTuple):
    """Where a trainer holds π_ref now (:attr:`BaseTrainer.held_reference`), for measurements: read it, never
    change the trainer through it."""

    module: Optional[nn.Module]  # ref_mode copy: π_ref as a module beside the policy; None under precompute
    weights: Mapping[str, Tensor]  # ref_mode precompute: π_ref's weights on the host (read-only); {} under copy
    parked_bytes: int  # π_ref's bytes parked in a file while the player is idle; 0 when it is not parked


def in_update_threads(method: Callable) -> Callable:
    """``method`` run with ``trainer.update_threads`` torch threads (0: the count as it is), the count restored after."""

    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        count, before = getattr(self.cfg, "update_threads", 0), torch.get_num_threads()
        if count <= 0 or count == before:
            return method(self, *args, **kwargs)
        torch.set_num_threads(count)
        try:
            return method(self, *args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


class BaseTrainer:
    """GRPO trainer of one player, whatever the backend (its use: :mod:`unifiedplayers.trainer`). A backend sets
    ``backend`` (its name in checkpoints), ``lockstep_micro_batches`` (every rank makes the same number of forward and
    backward calls) and ``collective_checkpoint`` (every rank writes its part of a checkpoint, else rank 0 all of it).
    """

    backend = "base"
    lockstep_micro_batches = False
    collective_checkpoint = False
    device: torch.device  # set by the backend's _setup

    def __init__(self, cfg, model: nn.Module, *, role: str = "player",
                 entropy_bank: Optional[Sequence[Sequence[int] | Tensor]] = None, pad_token_id: int = 0,
                 dist: DistContext = SINGLE) -> None:
        if cfg.ref_mode not in ("copy", "precompute"):
            raise ValueError(f"trainer.ref_mode must be 'copy' or 'precompute', got {cfg.ref_mode!r}")
        grpo.get_policy_loss(cfg.policy_loss)  # fail at start-up on an unknown name
        grpo.get_aggregation(cfg.aggregation)
        grpo.get_kl_estimator(cfg.kl_estimator)
        self.cfg, self.role, self.pad_token_id, self.dist = cfg, role, pad_token_id, dist
        if cfg.num_threads > 0:
            torch.set_num_threads(cfg.num_threads)
        self.compute_dtype = getattr(torch, resolve_setting(cfg.dtype, next(model.parameters()).device))
        model = self._prepare_model(model)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        model.train()
        self.global_step = self.outer_iteration = 0
        self._policy_is_reference = False
        self._ref_model: Optional[nn.Module] = None  # ref_mode copy: π_ref as a module
        self._ref_state: Optional[dict[str, Tensor]] = None  # ref_mode precompute: π_ref's weights on the host
        self._reference_parked: Optional[ParkedTensors] = None  # π_ref while the player is idle
        self.entropy_bank: list[Tensor] = []
        self.entropy = EntropyRetention()
        self.block_grad_norms: list[float] = []
        self._has_reference = False
        self._finished = False  # offload_state(final=True): the run's last update of this player is behind it
        if cfg.kl_coef != 0.0 and cfg.ref_mode == "copy":
            # Copied before a backend wraps or shards the model; loaded at the iteration's first update.
            self._ref_model = (share_base(model).requires_grad_(False).eval() if is_adapted(model) else
                               cast_parameters(copy.deepcopy(model), self.compute_dtype).requires_grad_(False).eval())
        self._setup(model)
        if entropy_bank is not None:
            self.set_entropy_bank(entropy_bank)

    # ------------------------------------------------------------------ what a backend supplies
    def _prepare_model(self, model: nn.Module) -> nn.Module:
        """The module the trainer holds, from the one it is given. Default: in ``compute_dtype`` (a backend with
        its own float32 master weights, such as DeepSpeed's bf16 mode)."""
        return cast_parameters(model, self.compute_dtype)

    def _setup(self, model: nn.Module) -> None:
        """Wrap ``model``; set ``device``, ``optimizer`` and ``scheduler`` (None until created)."""
        raise NotImplementedError

    @property
    def model(self) -> nn.Module:
        """The policy as a plain transformers module (the master weights)."""
        raise NotImplementedError

    @property
    def compute_model(self) -> nn.Module:
        """The module the trainer's forward and backward run through (default: :attr:`model`)."""
        return self.model

    def sampling_model(self, dtype: torch.dtype) -> nn.Module:
        """A module for rollouts in ``dtype``, equal to the policy after every step (default: :attr:`model` itself)."""
        return self.model

    def _sync_copies(self) -> None:
        """Bring the lower-precision copies of the weights (compute, rollouts) up to the master weights."""

    def _forward_module(self) -> nn.Module:
        """Callable ``(input_ids, attention_mask, select, with_entropy) -> TokenLogprobs``."""
        raise NotImplementedError

    def _ensure_optimizer(self) -> None:
        """Make the optimizer state present (create it lazily, or bring it back after an offload)."""
        raise NotImplementedError

    def _zero_grad(self) -> None:
        raise NotImplementedError

    def _backward(self, loss: Tensor) -> None:
        raise NotImplementedError

    def _set_accumulation_boundary(self, is_last_micro_batch: bool) -> None:
        """Tell a backend that reduces gradients at the accumulation boundary where it is (default: nothing)."""

    def _reduce_gradients(self) -> None:
        """Data-parallel ranks: sum the gradients over the ranks."""
        raise NotImplementedError

    def _step(self) -> float:
        """Clip, step, return the global grad norm before clipping."""
        raise NotImplementedError

    def current_lr(self) -> float:
        raise NotImplementedError

    def gathered_weights(self) -> ContextManager[None]:
        """A context in which :attr:`model` holds its full weights (to read them: export, a rollout engine's copy);
        a collective under a sharding backend. Default: nothing to gather."""
        return contextlib.nullcontext()

    def _load_policy_weights(self, state: Mapping[str, Tensor]) -> None:
        raise NotImplementedError

    def _save_backend(self, directory: Path) -> None:
        """Write the policy weights (:meth:`_save_weights`) and the optimizer state into ``directory``."""
        raise NotImplementedError

    def _save_weights(self, directory: Path, state: Mapping[str, Tensor]) -> None:
        """``model.pt``, what evaluation reads whatever the backend (an adapter player: its adapter alone, with its
        rank, alpha and targets beside it for :func:`~unifiedplayers.lora.checkpoint_weights`)."""
        torch.save(state, directory / MODEL_WEIGHTS)
        if is_adapted(self.model):
            adapter_config(self.model).save_pretrained(str(directory))

    def _load_backend(self, directory: Path) -> None:
        raise NotImplementedError

    def _offload_optimizer(self, keep: bool = True) -> None:
        """Park the optimizer state and whatever else of the backend an idle player does not sample with (back by
        :meth:`_ensure_optimizer`; ``keep=False``: freed unwritten)."""
        raise NotImplementedError

    @property
    def _holds_reference(self) -> bool:
        """Whether this rank keeps π_ref (default: every rank; ZeRO-3 swaps it in from rank 0 alone)."""
        return True

    @property
    def has_optimizer_state(self) -> bool:
        raise NotImplementedError

    def full_state_dict(self) -> dict[str, Tensor]:
        """Full (unsharded) policy weights, detached clones (a collective under a sharding backend)."""
        with self.gathered_weights():
            return {k: v.detach().clone() for k, v in policy_state(self.model).items()}

    def offload_state(self, final: bool = False) -> None:
        """The player goes idle: everything but the weights it samples with is parked (:mod:`.offload`). ``final``: it
        takes no further update in this run: that is freed unwritten, and a later update or save fails until a
        checkpoint is loaded."""
        self._park_reference(keep=not final)
        self._offload_optimizer(keep=not final)
        self._finished = final

    def _check_not_finished(self) -> None:
        if self._finished:
            raise RuntimeError(f"the {self.role} player took its last update of the run (offload_state(final=True) "
                               "freed its optimizer state and π_ref); load a checkpoint to train or save it again")

    def _offload_dir(self) -> Path:
        return Path(self.cfg.offload_dir or tempfile.gettempdir())

    def _host_weights(self) -> Optional[dict[str, Tensor]]:
        """The policy's full weights on the host on the ranks that hold π_ref, None on the others (a collective)."""
        with self.gathered_weights():
            return host_copy(policy_state(self.model)) if self._holds_reference else None

    # ------------------------------------------------------------------ reference policy
    def start_outer_iteration(self) -> None:
        """π_ref := the current weights (Appendix B.3), taken at the iteration's first step (:meth:`update`)."""
        self.outer_iteration += 1
        self._policy_is_reference = True
        self._discard_reference()

    @property
    def held_reference(self) -> HeldReference:
        """π_ref as this rank holds it now (:class:`HeldReference`)."""
        parked = self._reference_parked.nbytes if self._reference_parked is not None else 0
        return HeldReference(self._ref_model, MappingProxyType(self._ref_state or {}), parked)

    def _take_reference(self) -> None:
        """π_ref := the current weights, on the ranks that hold it (every rank calls it: a collective under ZeRO-3)."""
        self._restore_reference()  # a copy module's memory back: its values are loaded now
        if self.cfg.ref_mode == "copy":
            with self.gathered_weights(), torch.no_grad():
                load_policy_state(self._ref_model, policy_state(self.model))
            self._ref_model.to(self.device)
        else:  # precompute: keep the weights on the host, swap them in once per batch
            self._ref_state = self._host_weights()
        self._has_reference = True

    def _set_reference(self, state: Mapping[str, Tensor]) -> None:
        """π_ref := ``state`` (a checkpoint's ``reference.pt``, on the host)."""
        self._restore_reference()
        if self.cfg.ref_mode == "copy":
            load_policy_state(self._ref_model, state)
            self._ref_model.to(self.device)
        else:
            self._ref_state = {k: v.to("cpu") for k, v in state.items()}
        self._has_reference = True

    def _reference_tensors(self) -> list[Tensor]:
        if self.cfg.ref_mode == "copy":  # its parameters: its buffers are small, and load_state_dict skips some
            if self._ref_model is not None and is_adapted(self._ref_model):
                return adapter_parameters(self._ref_model)  # the backbone under it is every player's
            return list(self._ref_model.parameters()) if self._ref_model is not None else []
        return list((self._ref_state or {}).values())

    def _park_reference(self, keep: bool = True) -> None:
        """π_ref to a file without a name while the player is idle (freed unwritten: none taken, or not ``keep``)."""
        if self._reference_parked is None and self.cfg.kl_coef != 0.0:
            self._reference_parked = ParkedTensors(self._reference_tensors(), self._offload_dir(),
                                                   contents=self._has_reference and keep)

    def _restore_reference(self) -> None:
        if self._reference_parked is not None:
            self._reference_parked.restore()
            self._reference_parked = None

    def _discard_reference(self) -> None:
        """Forget π_ref (a new iteration, or a checkpoint's is loaded) and free its memory."""
        self._has_reference = False
        if self.cfg.kl_coef == 0.0:
            return
        if self.cfg.ref_mode == "precompute":
            if self._reference_parked is not None:
                self._reference_parked.discard()
                self._reference_parked = None
            self._ref_state = None
        elif self._reference_parked is not None:
            self._reference_parked.discard()  # a copy module keeps its storages, freed until the next copy
        else:
            self._reference_parked = ParkedTensors(self._reference_tensors(), self._offload_dir(), contents=False)

    @torch.no_grad()
    def _reference_logprobs(self, micro: list[_MicroBatch]) -> list[Optional[TokenLogprobs]]:
        if self.cfg.kl_coef == 0.0 or self._policy_is_reference:
            return [None] * len(micro)  # β = 0: not needed; π_θ = π_ref: taken from the policy pass
        if not self._has_reference:
            raise RuntimeError("kl_coef > 0 needs a reference policy: call start_outer_iteration() first")
        self._restore_reference()
        if self.cfg.ref_mode == "copy":
            ref = TokenLogprobModel(self._ref_model, self.cfg.temperature, self.cfg.logprob_chunk_rows)
            return [self._ref_pass(ref, mb) for mb in micro]
        current = self._host_weights()  # None on a rank that does not hold π_ref (ZeRO-3: all but rank 0)
        self._load_policy_weights(self._ref_state)
        try:
            return [self._ref_pass(self._forward_module(), mb) for mb in micro]
        finally:
            self._load_policy_weights(current)

    def _ref_pass(self, module: nn.Module, mb: _MicroBatch) -> TokenLogprobs:
        with eval_mode(module):
            return module(mb.input_ids, mb.attention_mask, mb.loss_mask)

    def _plan(self, samples: Sequence[TrainSample]) -> MicroBatchPlan:
        return plan_micro_batches(samples, self.cfg, rank=self.dist.rank, world_size=self.dist.world_size,
                                  lockstep=self.lockstep_micro_batches, device=self.device, pad_id=self.pad_token_id)

    # ------------------------------------------------------------------ the update
    @in_update_threads
    def update(self, batch: Iterable[Any], on_policy: bool = False) -> dict[str, float]:
        """One GRPO optimizer step over ``batch`` (:class:`TrainSample`-like items). ``on_policy``: the weights are
        those the batch was sampled with (a phase's first step), so ``actor/logprob_mismatch`` is reported."""
        samples = [as_sample(s) for s in batch]
        if not samples:
            raise ValueError("empty batch")
        t0 = time.perf_counter()
        self._check_not_finished()
        self._ensure_optimizer()  # an idle player's state back before the engine runs
        if self.cfg.kl_coef != 0.0 and self._policy_is_reference and not self._has_reference:
            self._take_reference()  # the iteration's first step: π_ref := the weights before it
        plan = self._plan(samples)
        refs = self._reference_logprobs(plan.micro)
        timings = {"perf/time_ref": time.perf_counter() - t0}
        parts = self._accumulate_gradients(plan, refs, timings, on_policy)
        t4 = time.perf_counter()
        if self.dist.enabled:
            self._reduce_gradients()
            parts = [m for rank_parts in self.dist.all_gather(parts) for m in rank_parts]
        lr = self.current_lr()
        grad_norm = self._step()
        timings["perf/time_optimizer"] = time.perf_counter() - t4
        t5 = time.perf_counter()
        self._sync_copies()
        timings["perf/time_weight_sync"] = time.perf_counter() - t5
        self.global_step += 1
        self._policy_is_reference = False
        self.block_grad_norms.append(grad_norm)

        metrics = _combine_metrics(parts)
        seconds = time.perf_counter() - t0
        metrics["perf/update_tflop_per_s"] = metrics["perf/update_tflop"] / seconds if seconds > 0 else 0.0
        metrics.update({"actor/grad_norm": grad_norm, "actor/lr": lr, "actor/num_samples": float(len(samples)),
                        "actor/num_micro_batches": float(plan.num_micro), "perf/pad_share": plan.pad_share,
                        "actor/global_step": float(self.global_step), **timings})
        self._record_bank_entropy(metrics)
        return metrics

    def _accumulate_gradients(self, plan: MicroBatchPlan, refs: list[Optional[TokenLogprobs]],
                              timings: dict[str, float], on_policy: bool = False) -> list[dict[str, float]]:
        """Forward and backward of every micro-batch of ``plan``; returns the metrics of those that hold tokens of the
        batch and adds forward/backward times to ``timings``."""
        cfg = self.cfg
        loss_fn = grpo.get_policy_loss(cfg.policy_loss)
        module = self._forward_module()
        self._zero_grad()
        t_fwd = t_bwd = 0.0
        parts: list[dict[str, float]] = []
        for index, (mb, ref) in enumerate(zip(plan.micro, refs)):
            self._set_accumulation_boundary(index == len(plan.micro) - 1)
            t1 = time.perf_counter()
            out = module(mb.input_ids, mb.attention_mask, mb.loss_mask, with_entropy=cfg.compute_entropy)
            loss, metrics = self._micro_batch_loss(loss_fn, out, mb, ref)
            if on_policy:
                metrics["actor/logprob_mismatch"] = logprob_mismatch(out.logprobs, mb.behaviour_logprobs, mb.loss_mask)
            elif mb.recomputed:  # π_old is the trainer's forward at the phase's start: its mismatch, at every step
                metrics["actor/logprob_mismatch"] = logprob_mismatch(mb.old_logprobs, mb.behaviour_logprobs,
                                                                     mb.loss_mask)
            t2 = time.perf_counter()
            self._backward(loss)
            t3 = time.perf_counter()
            t_fwd += t2 - t1
            t_bwd += t3 - t2
            if index < plan.real:  # a padding micro-batch has no tokens of the batch
                # Model FLOPs: forward and backward (3× the forward), plus the reference's forward.
                metrics["perf/update_tflop"] = (3 * out.flops + (ref.flops if ref is not None else 0)) * 1e-12
                parts.append(metrics)
        timings["perf/time_forward"] = t_fwd
        timings["perf/time_backward"] = t_bwd
        return parts

    def _micro_batch_loss(self, loss_fn: Callable, out: TokenLogprobs, mb: _MicroBatch,
                          ref: Optional[TokenLogprobs]) -> tuple[Tensor, dict[str, float]]:
        """The policy loss (Eqs. 18–21, :mod:`unifiedplayers.trainer.grpo`) of one micro-batch and its metrics."""
        cfg = self.cfg
        if ref is not None:
            ref_logprobs = ref.logprobs
        else:  # β = 0: not used; else π_θ = π_ref before the iteration's first step
            ref_logprobs = out.logprobs.detach() if cfg.kl_coef != 0.0 else None
        return loss_fn(out.logprobs, mb.old_logprobs, ref_logprobs, mb.advantages, mb.loss_mask, mb.groups,
                       clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
                       aggregation=cfg.aggregation, sample_weights=mb.weights, entropy=out.entropy,
                       **({} if mb.clip_high is None else {"clip_high": mb.clip_high}))

    @torch.no_grad()
    @in_update_threads
    def recompute_old_logprobs(self, samples: Sequence[TrainSample]) -> None:
        """π_old := this trainer's own forward over ``samples`` (``trainer.recompute_old_logprobs``), split as the
        update will be; each sample keeps what it was sampled with in ``behaviour_logprobs``."""
        samples = list(samples)
        if not samples:
            return
        plan = self._plan(samples)
        module = self._forward_module()
        mine = [self._ref_pass(module, mb).logprobs.float().cpu() for mb in plan.micro][: plan.real]
        by_rank = self.dist.all_gather(mine)
        for rank, share in enumerate(plan.per_rank):  # each rank's micro-batches, as in an update
            for members, logprobs in zip(share, by_rank[rank]):
                for row, sample in enumerate(samples[i] for i in members):
                    if sample.behaviour_logprobs is None:
                        sample.behaviour_logprobs = sample.old_logprobs
                    sample.old_logprobs = logprobs[row, : len(sample.token_ids)].clone()

    # ------------------------------------------------------------------ diagnostics (Appendix D.2)
    def set_entropy_bank(self, contexts: Sequence[Sequence[int] | Tensor]) -> None:
        """Fix the held-out role contexts (the first ``entropy_bank_size`` are kept)."""
        self.entropy_bank = [_as_tensor(c, torch.long) for c in list(contexts)[: self.cfg.entropy_bank_size]]

    def bank_entropy(self) -> float:
        """Mean token entropy of the current policy on the entropy bank (ranks share it; the one-rank value, bit for
        bit)."""
        if not self.entropy_bank:
            raise RuntimeError("no entropy bank: pass entropy_bank= to build_trainer or call set_entropy_bank")
        return shared_mean_token_entropy(self.compute_model, self.entropy_bank, self.dist,
                                         lockstep=self.lockstep_micro_batches)

    def start_block(self) -> dict[str, float]:
        """Reset block diagnostics; record the initial bank entropy if a bank is set."""
        self.block_grad_norms = []
        self.entropy.reset()
        if self.entropy_bank:
            self.entropy.record(self.bank_entropy(), self.global_step)
            return {"entropy_bank/initial": self.entropy.initial}
        return {}

    def _record_bank_entropy(self, metrics: dict[str, float]) -> None:
        """After every ``entropy_every``-th update (n > 0): the bank entropy and its retention into ``metrics``."""
        cfg = self.cfg
        if self.entropy_bank and cfg.entropy_every > 0 and self.global_step % cfg.entropy_every == 0:
            t5 = time.perf_counter()
            self.entropy.record(self.bank_entropy(), self.global_step)
            metrics["entropy_bank/mean"] = self.entropy.final
            metrics["entropy_ratio"] = self.entropy.ratio  # the retention so far: <role>/entropy_ratio
            metrics["perf/time_entropy_bank"] = time.perf_counter() - t5

    @in_update_threads  # as inside an update: the same floats
    def block_diagnostics(self) -> dict[str, float]:
        """The block is over: grad-norm median and CV of the block, and entropy retention (Appendix D.2), the final bank
        entropy scored now unless the last score is of these weights already."""
        if self.entropy_bank and self.entropy.history and self.entropy.step != self.global_step:
            self.entropy.record(self.bank_entropy(), self.global_step)
        out = grad_norm_block_stats(self.block_grad_norms)
        if self.entropy.ratio is not None:
            out["entropy_bank/initial"] = self.entropy.initial
            out["entropy_bank/final"] = self.entropy.final
            out["entropy_bank/retention"] = self.entropy.ratio
        return out

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        """Write weights, optimizer, scheduler, reference, RNG and trainer state atomically to ``path`` (every rank
        calls it)."""
        self._check_not_finished()
        if not self.dist.is_main and not self.collective_checkpoint:
            return Path(path)
        with atomic_directory(path, self.dist if self.collective_checkpoint else SINGLE) as tmp:
            self._save_backend(tmp)
            if self.dist.is_main:
                self._save_trainer_state(tmp)
        return Path(path)

    def _save_trainer_state(self, directory: Path) -> None:
        if self._has_reference:  # rank 0 holds it
            parked = self._reference_parked is not None
            self._restore_reference()
            ref = policy_state(self._ref_model) if self.cfg.ref_mode == "copy" else self._ref_state
            torch.save(ref, directory / REFERENCE)
            if parked:
                self._park_reference()
        torch.save({"backend": self.backend, "role": self.role, "global_step": self.global_step,
                    "outer_iteration": self.outer_iteration, "policy_is_reference": self._policy_is_reference,
                    **self.entropy.state(), "block_grad_norms": list(self.block_grad_norms)}, directory / TRAINER_STATE)
        torch.save(capture_rng_state(), directory / RNG_STATE)

    def load_checkpoint(self, path: str | os.PathLike, restore_rng: bool = True) -> None:
        """Restore everything :meth:`save_checkpoint` wrote; continuing equals an uninterrupted run."""
        directory = Path(path)
        state = torch.load(directory / TRAINER_STATE, weights_only=False)
        if state["backend"] != self.backend:
            raise ValueError(f"checkpoint {directory} was written by backend {state['backend']!r}, not {self.backend!r}")
        self._finished = False  # what final freed comes back (its values from the checkpoint)
        self._load_backend(directory)
        self.global_step = state["global_step"]
        self.outer_iteration = state["outer_iteration"]
        self._policy_is_reference = state["policy_is_reference"]
        self.entropy = EntropyRetention.from_state(state)
        self.block_grad_norms = list(state["block_grad_norms"])
        self._discard_reference()
        if (directory / REFERENCE).exists() and self.cfg.kl_coef != 0.0:
            if self._holds_reference:
                self._set_reference(torch.load(directory / REFERENCE, map_location="cpu", weights_only=True))
            self._has_reference = True  # taken, whichever rank holds it
        if restore_rng:
            restore_rng_state(torch.load(directory / RNG_STATE, weights_only=False))


def host_copy(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state``'s tensors copied to the host; tensors that are one (tied embeddings) stay one."""
    out: dict[str, Tensor] = {}
    copies: dict[tuple, Tensor] = {}
    for name, t in state.items():
        t = t.detach()
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in copies:
            copies[key] = t.to("cpu", copy=True)
        out[name] = copies[key]
    return out
