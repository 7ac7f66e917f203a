"""Model FLOPs of the trainer's passes, counted from the shapes that ran (the MFU convention; one multiply-add is
2 FLOPs). A decoder-only LM's forward costs 2 · P_lin per token (P_lin: the decoder's linear weights), 4 · heads ·
head_dim per causal (query, key) pair per layer, and 2 · hidden · vocab per row the LM head scores. An update costs 3×
the forward of what it trains; recomputation is not counted, the padding positions are. They give
``perf/update_tflop_per_s`` (benchmarks/README.md).
"""
from __future__ import annotations

from typing import Optional

from torch import nn


def linear_weights(body: nn.Module) -> int:
    """Weights of the ``nn.Linear`` layers inside ``body``, from their shapes (so under ZeRO-3 too)."""
    return sum(m.in_features * m.out_features for m in body.modules() if isinstance(m, nn.Linear))


def attention_shape(config: object) -> Optional[tuple[int, int, int]]:
    """(layers, query heads, head dim) from a transformers config, or None when it does not say."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not layers or not heads:
        return None
    head_dim = getattr(config, "head_dim", None) or getattr(config, "hidden_size", 0) // heads
    return int(layers), int(heads), int(head_dim)


def causal_pairs(end: int, start: int = 0) -> int:
    """(query, key) pairs of causal attention of the queries at start … end − 1: Σ_{i=start}^{end−1} (i + 1)."""
    if end <= start:
        return 0
    return (end * (end + 1) - start * (start + 1)) // 2


def decoder_forward_flops(body: nn.Module, batch: int, length: int, prefix: int = 0) -> int:
    """FLOPs of the decoder over ``batch`` rows of ``length`` positions whose first ``prefix`` positions
    are common to all rows and run once (0: every row runs in full)."""
    tokens = prefix + batch * (length - prefix)
    flops = 2 * linear_weights(body) * tokens
    shape = attention_shape(getattr(body, "config", None))
    if shape is not None:
        layers, heads, head_dim = shape
        pairs = causal_pairs(prefix) + batch * causal_pairs(length, prefix)
        flops += 4 * heads * head_dim * layers * pairs
    return flops


def head_forward_flops(vocab: int, hidden: int, rows: int) -> int:
    """FLOPs of an LM head from ``hidden`` to ``vocab`` logits on ``rows`` hidden states."""
    return 2 * vocab * hidden * rows
