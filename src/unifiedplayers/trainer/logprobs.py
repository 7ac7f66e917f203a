"""Log-probabilities of chosen tokens from a causal LM, computing logits only where they are needed.

A full ``model(input_ids).logits`` materialises (B, L, V) floats. The loss only needs the log-prob of the
*trainable* tokens, so we run the decoder body, gather the hidden states at the positions that predict
those tokens and apply the LM head to these rows only (M × V instead of B × L × V).

Two more savings, both exact up to float rounding:
- the rows of a GRPO group start with the same prompt, so the decoder runs that shared prefix once and
  the rows continue from its KV cache (:func:`decoder_hidden`);
- the LM head, log-softmax and entropy are one autograd function (:class:`HeadLogprob`) whose backward is
  the two LM-head matmuls and nothing else: the softmax it needs is kept from the forward pass (or
  recomputed chunk by chunk when memory is short).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

from unifiedplayers.models import cache_keyword, returned_cache
from unifiedplayers.trainer.flops import decoder_forward_flops, head_forward_flops

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
    flops: int = 0  # model FLOPs of the forward pass that produced them (:mod:`.flops`)


def shared_prefix_length(input_ids: Tensor, attention_mask: Tensor) -> int:
    """Number of leading positions where every row holds the same real token. ``input_ids``: (B, L)."""
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


def _activation_checkpointing(model: nn.Module) -> bool:
    return hasattr(type(model), "is_gradient_checkpointing") and bool(model.is_gradient_checkpointing)


def prefix_to_share(input_ids: Tensor, attention_mask: Tensor, min_shared_prefix: int) -> int:
    """The leading positions :func:`decoder_hidden` runs once for all rows: the common prefix when it has at
    least ``min_shared_prefix`` (> 0) tokens and the batch has several rows, else 0. Never the whole row."""
    batch, length = input_ids.shape
    if batch < 2 or min_shared_prefix <= 0:
        return 0
    prefix = min(shared_prefix_length(input_ids, attention_mask), length - 1)
    return prefix if prefix >= min_shared_prefix else 0


def decoder_hidden(body: nn.Module, input_ids: Tensor, attention_mask: Tensor, prefix: int = 0) -> Tensor:
    """Last hidden states (B, L, H) of the decoder body over right-padded rows.

    With ``prefix > 0`` (leading tokens common to all rows, such as the prompt of a group's samples; see
    :func:`prefix_to_share`), the prefix runs once and every row continues from a copy of its KV cache; the
    gradient of all rows flows back through the one prefix pass. Same values as running every row in full.
    """
    batch, length = input_ids.shape
    if prefix <= 0:
        return body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    shared = body(input_ids=input_ids[:1, :prefix], use_cache=True)
    cache = returned_cache(shared)
    cache.batch_repeat_interleave(batch)
    positions = torch.arange(prefix, length, device=input_ids.device).expand(batch, -1)
    rest = body(
        input_ids=input_ids[:, prefix:],
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        **{cache_keyword(body): cache},
    ).last_hidden_state
    return torch.cat([shared.last_hidden_state.expand(batch, -1, -1), rest], dim=1)


def selected_token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    select: Tensor,
    with_entropy: bool = False,
    temperature: float = 1.0,
    chunk_rows: int = 0,
    min_shared_prefix: int = 16,
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
            (when M is larger, the backward recomputes the logits chunk by chunk: one more LM-head
            matmul). 0, or M ≤ chunk_rows: the (M, V) softmax is kept for the backward. A head with a
            bias, or one whose weight is sharded (ZeRO-3), takes plain autograd.
        min_shared_prefix: a prefix of at least this many tokens common to all rows runs once
            (:func:`decoder_hidden`); 0 never shares. Not used with gradient checkpointing or ZeRO-3.
    Returns:
        :class:`TokenLogprobs` with (B, L) tensors, zeros where not selected.
    """
    if bool(select[:, 0].any()):
        raise ValueError("the first token of a sequence has no prediction; mask it out of the loss")
    body, head = split_causal_lm(model)
    weight = getattr(head, "weight", None)
    zero3 = weight is not None and hasattr(weight, "ds_id")  # parameters gathered per module call
    checkpointing = _activation_checkpointing(model)  # its recomputation must save what the forward saved
    if checkpointing or zero3:
        min_shared_prefix = 0
    prefix = prefix_to_share(input_ids, attention_mask, min_shared_prefix)
    hidden = decoder_hidden(body, input_ids, attention_mask, prefix)
    # Position t - 1 predicts token t.
    pred_select = torch.zeros_like(select)
    pred_select[:, :-1] = select[:, 1:]
    rows = hidden[pred_select]  # (M, H)
    targets = input_ids[select]  # (M,)
    fused = (
        isinstance(head, nn.Linear)
        and head.bias is None
        and weight is not None
        and weight.dim() == 2
        and weight.shape[1] == rows.shape[-1]
        and not zero3  # the weight saved for backward would be released (partitioned) by then
    )
    if fused:
        # Keep the (M, V) softmax for the backward when no chunk size bounds it, or when it fits in one chunk.
        keep_probs = (chunk_rows <= 0 or rows.shape[0] <= chunk_rows) and torch.is_grad_enabled()
        keep_probs = keep_probs and (rows.requires_grad or weight.requires_grad)
        chosen, h = HeadLogprob.apply(
            rows, weight, targets, chunk_rows if chunk_rows > 0 else _ROWS, 1.0 / temperature, with_entropy, keep_probs
        )
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
    # An nn.Linear knows its shape even when ZeRO-3 has partitioned its weight; any other head took the
    # plain path above, whose logits say the vocabulary.
    vocab = head.out_features if isinstance(head, nn.Linear) else logits.shape[-1]
    flops = decoder_forward_flops(body, *input_ids.shape, prefix) + head_forward_flops(vocab, rows.shape[-1], targets.numel())
    return TokenLogprobs(out, ent, flops)


@torch.no_grad()
def _entropy_rows(logits: Tensor, lse: Tensor, chunk: int) -> Tensor:
    """H = lse − Σ softmax · logits per row, a chunk of rows at a time (bounded temporaries)."""
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for s in range(0, logits.shape[0], chunk):
        z = logits[s : s + chunk]
        out[s : s + chunk] = lse[s : s + chunk] - (torch.exp(z - lse[s : s + chunk, None]) * z).sum(-1)
    return out


_ROWS = 256  # rows of (rows, V) logits at a time when no chunk size is given
_BLOCK = 16  # rows per pass of the softmax statistics: two (16, V) blocks stay in the L3 cache


def _logits_into(out: Tensor, hidden: Tensor, weight: Tensor, inv_temp: float) -> Tensor:
    """out[:] = hidden W^T / T in float32, written in place (out: (rows, V) float32)."""
    if hidden.dtype == torch.float32 and weight.dtype == torch.float32:
        torch.mm(hidden, weight.t(), out=out)
    else:
        out.copy_(hidden @ weight.t())
    if inv_temp != 1.0:
        out.mul_(inv_temp)
    return out


def _softmax_stats_(z: Tensor, targets: Tensor, lse: Tensor, chosen: Tensor, ent: Optional[Tensor], to_probs: bool) -> None:
    """Per row of logits ``z`` (rows, V): lse = log Σ exp z, chosen = z[target] − lse, the entropy
    H = log Σ e − Σ e·t / Σ e with t = z − max z and e = exp t, and with ``to_probs`` z := softmax(z) in place.
    ``z`` is overwritten either way. A few rows at a time, so that the passes run from cache, not memory."""
    block = torch.empty(min(_BLOCK, z.shape[0]), z.shape[1], dtype=z.dtype, device=z.device)
    for s in range(0, z.shape[0], _BLOCK):
        t, e = z[s : s + _BLOCK], block[: min(_BLOCK, z.shape[0] - s)]
        top = t.amax(dim=-1, keepdim=True)
        t.sub_(top)
        torch.exp(t, out=e)
        total = e.sum(dim=-1, keepdim=True)
        log_total = total.log()
        lse[s : s + _BLOCK] = (top + log_total).squeeze(-1)
        chosen[s : s + _BLOCK] = (t.gather(-1, targets[s : s + _BLOCK, None]) - log_total).squeeze(-1)
        if ent is not None:
            ent[s : s + _BLOCK] = (log_total - torch.linalg.vecdot(e, t)[:, None] / total).squeeze(-1)
        if to_probs:
            torch.div(e, total, out=t)


def _weight_grad(dz: Tensor, hidden: Tensor, dtype: torch.dtype) -> Tensor:
    """d W = d zᵀ h: in float32 for float32 rows; under mixed precision, the matmul in the rows' dtype (bf16), as
    every other matmul of the backward."""
    if hidden.dtype == torch.float32:
        return (dz.t() @ hidden).to(dtype)
    return (dz.to(hidden.dtype).t() @ hidden).to(dtype)


class HeadLogprob(torch.autograd.Function):
    """log softmax(h W^T / T)[target] (and optionally the entropy) for rows of h, without autograd's
    (M, V) temporaries.

    With ``keep_probs`` the forward fills one (M, V) float32 block with the softmax P and keeps it; the
    backward turns it in place into d logp / d z = onehot(target) − P scaled by the incoming gradient and
    does the two matmuls d h = (d z / T) W, d W = (d z / T)^T h. Without it, nothing of size V outlives a
    chunk of ``chunk`` rows, and the backward recomputes each chunk's logits.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, inv_temp, with_entropy, keep_probs):
        m, vocab = hidden.shape[0], weight.shape[0]
        chosen = torch.empty(m, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(m, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(m, dtype=torch.float32, device=hidden.device) if with_entropy else None
        if keep_probs:  # one LM-head matmul over all rows; its output becomes the kept softmax
            probs = _logits_into(torch.empty(m, vocab, dtype=torch.float32, device=hidden.device), hidden, weight, inv_temp)
            _softmax_stats_(probs, targets, lse, chosen, ent, to_probs=True)
        else:
            buffer = torch.empty(min(chunk, m), vocab, dtype=torch.float32, device=hidden.device)
            for s in range(0, m, chunk):
                e = min(s + chunk, m)
                z = _logits_into(buffer[: e - s], hidden[s:e], weight, inv_temp)
                _softmax_stats_(z, targets[s:e], lse[s:e], chosen[s:e], None if ent is None else ent[s:e], to_probs=False)
        ctx.keep_probs, ctx.chunk, ctx.inv_temp = keep_probs, chunk, inv_temp
        ctx.save_for_backward(hidden, weight, targets, probs if keep_probs else lse)
        if ent is not None:
            ctx.mark_non_differentiable(ent)
        return chosen, ent

    @staticmethod
    def backward(ctx, grad_chosen, grad_ent):
        hidden, weight, targets, saved = ctx.saved_tensors
        g = grad_chosen.float() * ctx.inv_temp  # d z of a row = g (onehot − softmax) / T
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if ctx.keep_probs:
            # The kept softmax becomes d z in place (a second backward through this graph fails loudly:
            # autograd sees the saved tensor modified).
            dz = saved.mul_(-g[:, None]).scatter_add_(-1, targets[:, None], g[:, None])
            grad_hidden = dz.to(hidden.dtype) @ weight if need_h else None
            grad_weight = _weight_grad(dz, hidden, weight.dtype) if need_w else None
            return grad_hidden, grad_weight, None, None, None, None, None
        lse = saved
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        buffer = torch.empty(min(ctx.chunk, hidden.shape[0]), weight.shape[0], dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[s : s + ctx.chunk]
            z = _logits_into(buffer[: h.shape[0]], h, weight, ctx.inv_temp)
            gs = g[s : s + ctx.chunk]
            dz = z.sub_(lse[s : s + ctx.chunk, None]).exp_().mul_(-gs[:, None])  # −g · softmax / T
            dz.scatter_add_(-1, targets[s : s + ctx.chunk, None], gs[:, None])  # + g · onehot / T
            if grad_hidden is not None:
                grad_hidden[s : s + ctx.chunk] = dz.to(hidden.dtype) @ weight
            if grad_weight is not None:
                if h.dtype == torch.float32:
                    grad_weight.addmm_(dz.t(), h)
                else:  # the matmul in the compute dtype, the sum over chunks in float32
                    grad_weight.add_(dz.to(h.dtype).t() @ h)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


class TokenLogprobModel(nn.Module):
    """Wraps a causal LM so that ``forward`` returns :func:`selected_token_logprobs`.

    Backends that hook the top-level forward (DeepSpeed ZeRO-3 counts micro-steps there) wrap this
    module rather than the LM, so the memory-lean log-prob path still goes through their ``forward``.
    """

    def __init__(self, lm: nn.Module, temperature: float = 1.0, chunk_rows: int = 0, min_shared_prefix: int = 16) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        self.chunk_rows = chunk_rows
        self.min_shared_prefix = min_shared_prefix

    def forward(self, input_ids: Tensor, attention_mask: Tensor, select: Tensor, with_entropy: bool = False):
        return selected_token_logprobs(self.lm, input_ids, attention_mask, select, with_entropy=with_entropy,
                                       temperature=self.temperature, chunk_rows=self.chunk_rows,
                                       min_shared_prefix=self.min_shared_prefix)


ENTROPY_BATCH = 16  # held-out contexts per forward of the entropy bank
ENTROPY_ROWS = 512  # positions per (rows, V) logits block of the entropy bank


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode while inside, its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def context_rows(body: nn.Module, contexts: list[Tensor], device: torch.device) -> Tensor:
    """Last hidden states (positions, H) at every position of ``contexts``, run as one right-padded batch."""
    length = max(len(c) for c in contexts)
    ids = torch.zeros(len(contexts), length, dtype=torch.long, device=device)
    att = torch.zeros(len(contexts), length, dtype=torch.long, device=device)
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = c.to(device)
        att[i, : len(c)] = 1
    hidden = body(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
    return hidden[att.bool()]


def rows_entropy_sum(head: nn.Module, rows: Tensor) -> float:
    """Σ over ``rows`` (M, H) of the entropy of the next-token distribution, H = −Σ_v p_v log p_v."""
    logp = torch.log_softmax(head(rows).float(), dim=-1)
    return float(-(logp.exp() * logp).sum())


@torch.no_grad()
def entropy_part_sums(body: nn.Module, head: nn.Module, contexts: list[Tensor],
                      device: torch.device) -> list[tuple[float, int]]:
    """One forward over ``contexts``; per :data:`ENTROPY_ROWS`-row part of its positions (bounding the (rows, V)
    logits), the part's (Σ token entropy, rows)."""
    rows = context_rows(body, contexts, device)
    return [(rows_entropy_sum(head, part), part.shape[0]) for part in rows.split(ENTROPY_ROWS)]


@torch.no_grad()
def mean_token_entropy(model: nn.Module, contexts: list[Tensor], batch_size: int = ENTROPY_BATCH) -> float:
    """Mean entropy of the next-token distribution over all positions of held-out contexts.

    Used for entropy retention (Appendix D.2): the same fixed bank is scored at the block's start and end. Every
    position of each context contributes one token entropy. The part sums are added in bank order, as
    :mod:`unifiedplayers.trainer.entropy` adds them when the ranks share the bank.
    """
    body, head = split_causal_lm(model)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with eval_mode(model):
        for start in range(0, len(contexts), batch_size):
            for part_sum, rows in entropy_part_sums(body, head, contexts[start : start + batch_size], device):
                total += part_sum
                count += rows
    return total / max(count, 1)
