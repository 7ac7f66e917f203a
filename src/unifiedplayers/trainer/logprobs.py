"""Log-probabilities of chosen tokens from a causal LM, computing logits only where they are needed.

A full ``model(input_ids).logits`` materialises (B, L, V) floats; with V = 49k (SmolLM2) and 8 × 305
tokens that is 480 MB before the log-softmax doubles it. The loss only needs the log-prob of the
*trainable* tokens, so we run the decoder body, gather the hidden states at the positions that predict
those tokens and apply the LM head to these rows only (M × V instead of B × L × V).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

Tensor = torch.Tensor


def split_causal_lm(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(decoder body returning hidden states, LM head) of a transformers ``*ForCausalLM``."""
    head = model.get_output_embeddings()
    body = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if head is None or body is None or body is model:
        raise TypeError(f"{type(model).__name__} is not a transformers causal LM with a separate LM head")
    return body, head


@dataclass
class TokenLogprobs:
    """Log-probs (and optionally entropies) of the selected tokens, as flat rows and as (B, L) grids."""

    logprobs: Tensor  # (B, L): log π(token_t | tokens_<t) at selected positions, 0 elsewhere
    entropy: Optional[Tensor]  # (B, L) token entropy at selected positions (no grad), or None


def selected_token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    select: Tensor,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> TokenLogprobs:
    """log π(input_ids[b, t] | input_ids[b, :t]) for every (b, t) with ``select[b, t]``.

    Args:
        model: a transformers causal LM (or a DeepSpeed engine's ``module``).
        input_ids: (B, L) right-padded token ids.
        attention_mask: (B, L) 1 for real tokens.
        select: (B, L) bool; position 0 can never be selected (nothing predicts it).
        with_entropy: also return the entropy of the predictive distribution at those positions.
        temperature: logits are divided by it (match the sampler's temperature).
    Returns:
        :class:`TokenLogprobs` with (B, L) tensors, zeros where not selected.
    """
    if bool(select[:, 0].any()):
        raise ValueError("the first token of a sequence has no prediction; mask it out of the loss")
    body, head = split_causal_lm(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    # Position t - 1 predicts token t.
    pred_select = torch.zeros_like(select)
    pred_select[:, :-1] = select[:, 1:]
    rows = hidden[pred_select]  # (M, H)
    logits = head(rows).float()  # (M, V)
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[select]  # (M,)
    lse = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    out = torch.zeros(select.shape, dtype=chosen.dtype, device=chosen.device)
    out = out.masked_scatter(select, chosen)
    ent = None
    if with_entropy:
        with torch.no_grad():
            d = logits.detach()
            probs = torch.softmax(d, dim=-1)
            h = lse.detach() - (probs * d).sum(-1)
            ent = torch.zeros(select.shape, dtype=h.dtype, device=h.device).masked_scatter(select, h)
    return TokenLogprobs(out, ent)


class TokenLogprobModel(nn.Module):
    """Wraps a causal LM so that ``forward`` returns :func:`selected_token_logprobs`.

    Backends that hook the top-level forward (DeepSpeed ZeRO-3 counts micro-steps there) wrap this
    module rather than the LM, so the memory-lean log-prob path still goes through their ``forward``.
    """

    def __init__(self, lm: nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature

    def forward(self, input_ids: Tensor, attention_mask: Tensor, select: Tensor, with_entropy: bool = False):
        return selected_token_logprobs(
            self.lm, input_ids, attention_mask, select, with_entropy=with_entropy, temperature=self.temperature
        )


@torch.no_grad()
def mean_token_entropy(model: nn.Module, contexts: list[Tensor], batch_size: int = 16) -> float:
    """Mean entropy of the next-token distribution over all positions of held-out contexts.

    Used for SPEC §8's entropy retention: the same fixed bank is scored at block start and after each
    update. Every position of each context contributes one token entropy.
    """
    body, head = split_causal_lm(model)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(contexts), batch_size):
            chunk = contexts[start : start + batch_size]
            length = max(len(c) for c in chunk)
            ids = torch.zeros(len(chunk), length, dtype=torch.long, device=device)
            att = torch.zeros(len(chunk), length, dtype=torch.long, device=device)
            for i, c in enumerate(chunk):
                ids[i, : len(c)] = c.to(device)
                att[i, : len(c)] = 1
            hidden = body(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
            rows = hidden[att.bool()]
            for part in rows.split(512):  # bound the (rows, V) logits
                logp = torch.log_softmax(head(part).float(), dim=-1)
                total += float(-(logp.exp() * logp).sum())
                count += part.shape[0]
    finally:
        model.train(was_training)
    return total / max(count, 1)
