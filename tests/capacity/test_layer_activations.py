"""The capacity plan's activations per token and decoder layer (``Arch.layer_activations``) against what autograd
keeps for the backward of a real transformers decoder layer (the tiny Llama, float32), counted by storage."""
from __future__ import annotations

import pytest
import torch

from tests.trainer.trainer_helpers import tiny_model
from unifiedplayers.capacity.arch import arch_from_config

pytestmark = pytest.mark.cpu


def saved_values_per_token(model, layer, length: int) -> float:
    """The float32 values one forward of ``layer`` over ``length`` positions saves for its backward, per position;
    the weights and the rotary tables are not activations."""
    hidden = torch.randn(1, length, model.config.hidden_size, requires_grad=True)
    positions = torch.arange(length)[None]
    rotary = model.model.rotary_emb(hidden, positions)
    not_counted = {p.untyped_storage().data_ptr() for p in model.parameters()}
    not_counted |= {t.untyped_storage().data_ptr() for t in rotary}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(hidden, attention_mask=None, position_embeddings=rotary, position_ids=positions)
    return sum(n for ptr, n in saved.items() if ptr not in not_counted) / 4 / length


def test_the_plan_counts_what_a_decoder_layer_keeps_for_its_backward():
    model, _ = tiny_model()
    arch = arch_from_config(model.config.to_dict(), "tiny")
    for length in (32, 64):  # per position: no term grows with the length (SDPA keeps no attention matrix)
        measured = saved_values_per_token(model, model.model.layers[0], length)
        assert arch.layer_activations() <= measured <= 1.02 * arch.layer_activations(), (measured,
                                                                                        arch.layer_activations())
