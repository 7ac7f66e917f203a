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
    chunk_rows: int = 0,
) -> TokenLogprobs:
    """log π(input_ids[b, t] | input_ids[b, :t]) for every (b, t) with ``select[b, t]``.

    Args:
        model: a transformers causal LM (or a DeepSpeed engine's ``module``).
        input_ids: (B, L) right-padded token ids.
        attention_mask: (B, L) 1 for real tokens.
        select: (B, L) bool; position 0 can never be selected (nothing predicts it).
        with_entropy: also return the entropy of the predictive distribution at those positions.
        temperature: logits are divided by it (match the sampler's temperature).
        chunk_rows: > 0: never hold more than this many rows of (rows, V) logits, forward or backward
            (:class:`ChunkedHeadLogprob`; the backward recomputes the logits chunk by chunk). 0: one
            (M, V) block kept for autograd, faster by one LM-head matmul. A head with a bias, or one
            whose weight is sharded (ZeRO-3), always takes the plain path.
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
    targets = input_ids[select]  # (M,)
    weight = getattr(head, "weight", None)
    chunkable = (
        chunk_rows > 0
        and isinstance(head, nn.Linear)
        and head.bias is None
        and weight is not None
        and weight.dim() == 2
        and weight.shape[1] == rows.shape[-1]  # a ZeRO-3 partitioned weight is a flat placeholder
    )
    if chunkable:
        chosen, h = ChunkedHeadLogprob.apply(rows, weight, targets, chunk_rows, 1.0 / temperature, with_entropy)
    else:
        logits = head(rows).float()  # (M, V)
        if temperature != 1.0:
            logits = logits / temperature
        lse = torch.logsumexp(logits, dim=-1)
        chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        h = _entropy_rows(logits.detach(), lse.detach(), 1024) if with_entropy else None
    out = torch.zeros(select.shape, dtype=chosen.dtype, device=chosen.device).masked_scatter(select, chosen)
    ent = None
    if h is not None:
        ent = torch.zeros(select.shape, dtype=h.dtype, device=h.device).masked_scatter(select, h)
    return TokenLogprobs(out, ent)


@torch.no_grad()
def _entropy_rows(logits: Tensor, lse: Tensor, chunk: int) -> Tensor:
    """H = lse − Σ softmax · logits per row, a chunk of rows at a time (bounded temporaries)."""
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for s in range(0, logits.shape[0], chunk):
        z = logits[s : s + chunk]
        out[s : s + chunk] = lse[s : s + chunk] - (torch.exp(z - lse[s : s + chunk, None]) * z).sum(-1)
    return out


class ChunkedHeadLogprob(torch.autograd.Function):
    """log softmax(h W^T / T)[target] for rows of h, chunk by chunk, without keeping (M, V) logits.

    Forward keeps only h, W, the targets and the row log-sum-exps; backward recomputes each chunk's
    logits: d logp / d z = onehot(target) − softmax(z), then d h = (d z / T) W and d W = (d z / T)^T h.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, inv_temp, with_entropy):
        m = hidden.shape[0]
        chosen = torch.empty(m, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(m, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(m, dtype=torch.float32, device=hidden.device) if with_entropy else None
        for s in range(0, m, chunk):
            z = (hidden[s : s + chunk] @ weight.t()).float()
            if inv_temp != 1.0:
                z = z * inv_temp
            l = torch.logsumexp(z, dim=-1)
            lse[s : s + chunk] = l
            chosen[s : s + chunk] = z.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - l
            if with_entropy:
                ent[s : s + chunk] = l - (torch.exp(z - l[:, None]) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk, ctx.inv_temp = chunk, inv_temp
        if ent is not None:
            ctx.mark_non_differentiable(ent)
        return chosen, ent

    @staticmethod
    def backward(ctx, grad_chosen, grad_ent):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s : s + ctx.chunk]
            z = (h @ weight.t()).float()
            if ctx.inv_temp != 1.0:
                z = z * ctx.inv_temp
            g = grad_chosen[s : s + ctx.chunk].float()
            dz = torch.exp(z - lse[s : s + ctx.chunk, None]).mul_(-g[:, None])  # −g · softmax
            dz.scatter_add_(-1, targets[s : s + ctx.chunk, None], g[:, None])  # + g · onehot
            if ctx.inv_temp != 1.0:
                dz.mul_(ctx.inv_temp)
            dz = dz.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[s : s + ctx.chunk] = dz @ weight
            if grad_weight is not None:
                grad_weight.addmm_(dz.t().float(), h.float())
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


class TokenLogprobModel(nn.Module):
    """Wraps a causal LM so that ``forward`` returns :func:`selected_token_logprobs`.

    Backends that hook the top-level forward (DeepSpeed ZeRO-3 counts micro-steps there) wrap this
    module rather than the LM, so the memory-lean log-prob path still goes through their ``forward``.
    """

    def __init__(self, lm: nn.Module, temperature: float = 1.0, chunk_rows: int = 0) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        self.chunk_rows = chunk_rows

    def forward(self, input_ids: Tensor, attention_mask: Tensor, select: Tensor, with_entropy: bool = False):
        return selected_token_logprobs(
            self.lm,
            input_ids,
            attention_mask,
            select,
            with_entropy=with_entropy,
            temperature=self.temperature,
            chunk_rows=self.chunk_rows,
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
