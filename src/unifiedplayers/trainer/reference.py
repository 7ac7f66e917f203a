"""π_ref of a trainer (Appendix B.3, Eq. 20: the KL penalty's reference, saved at the start of the outer iteration):
when it is taken, where it lives, and the reference pass. A mixin of :class:`~unifiedplayers.trainer.base.BaseTrainer`,
kept apart so that the trainer's update reads in one sitting."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NamedTuple, Optional

import torch
from torch import nn

from unifiedplayers.trainer.batching import _MicroBatch
from unifiedplayers.lora import adapter_parameters, is_adapted, load_policy_state, policy_state
from unifiedplayers.trainer.logprobs import TokenLogprobModel, TokenLogprobs
from unifiedplayers.trainer.offload import ParkedTensors

Tensor = torch.Tensor


class HeldReference(NamedTuple):
    """Where a trainer holds π_ref now (:attr:`ReferencePolicy.held_reference`), for measurements: read it, never
    change the trainer through it."""

    module: Optional[nn.Module]  # ref_mode copy: π_ref as a module beside the policy; None under precompute
    weights: Mapping[str, Tensor]  # ref_mode precompute: π_ref's weights on the host (read-only); {} under copy
    parked_bytes: int  # π_ref's bytes parked in a file while the player is idle; 0 when it is not parked


class ReferencePolicy:
    """The reference methods of :class:`~unifiedplayers.trainer.base.BaseTrainer` (its attributes are the trainer's)."""

    @property
    def held_reference(self) -> HeldReference:
        """π_ref as this rank holds it now: its module (ref_mode copy), its host weights (precompute; none before it
        is taken, nor on a rank that does not hold it), and the bytes parked while the player is idle."""
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
        """π_ref to a file without a name while the player is idle (freed without a file when none is taken, or
        when ``keep`` is False: it is of no further use)."""
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
        was = module.training
        module.eval()
        try:
            return module(mb.input_ids, mb.attention_mask, mb.loss_mask)
        finally:
            module.train(was)

    # ------------------------------------------------------------------ the update
