"""The hf engine's shared-prefix KV cache (``rollout.prefix_cache``).

Probes and evaluation batches start every prompt with the same system prompt and few-shot examples, and the
tool loop sends the whole transcript again at each turn: most of their prefill recomputes keys and values
already computed. :class:`PrefixStore` keeps the KV tensors of a few such prefixes (one row each) and hands
back the longest stored match of a new prefix; the engine (:mod:`unifiedplayers.rollout.hf_engine`) prefills
only what lies past it.

The stored tensors are valid only for the weights that made them. :class:`WeightsStamp` records, for every
parameter, the object, its autograd version counter (bumped by any in-place write through the parameter:
optimizer steps, ``copy_``, ``load_state_dict``), its storage address and dtype (``p.data = ...``,
``module.to``), and a few of its values (writes through ``p.data``, which bypass the version counter). Any
difference empties the store.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional, Sequence

import torch

MIN_PREFIX = 32  # a shared prefix shorter than this is prefilled with the rest (two passes would not pay)
MAX_ENTRIES = 4  # prefixes kept across calls (each holds one row of KV per layer)
_SAMPLES = 8  # values per parameter in a WeightsStamp

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (1, heads, length, head_dim)


def prefix_setting(value: Any, name: str = "rollout.prefix_cache") -> Optional[bool]:
    """An auto/true/false setting (``rollout.prefix_cache``, ``rollout.packed_linears``) as True (always), False
    (never) or None (auto: the engine decides). Hydra may hand a YAML ``true``/``false`` as a bool."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return None
    if text in ("true", "on", "1", "yes"):
        return True
    if text in ("false", "off", "0", "no"):
        return False
    raise ValueError(f"{name}={value!r}: expected auto, true or false")


def shared_length(a: Sequence[int], b: Sequence[int], limit: Optional[int] = None) -> int:
    """How many leading tokens ``a`` and ``b`` share (at most ``limit``)."""
    end = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    i = 0
    while i < end and a[i] == b[i]:
        i += 1
    return i


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``prompts`` share, leaving each at least one token of its own: the
    prefill must still produce every prompt's last-position logits."""
    length = max(min(len(p) for p in prompts) - 1, 0)
    for ids in prompts[1:]:
        length = shared_length(prompts[0], ids, length)
    return length


class WeightsStamp:
    """What identifies a model's current weights (see the module docstring); ``None`` from :meth:`of` for
    partitioned (ZeRO-3) parameters, whose local tensors say nothing about the full weights."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params  # held so that ids cannot be reused by other tensors while the stamp lives
        self.meta = [(p._version, p.data_ptr(), p.dtype, p.shape) for p in params]
        self.values = self._sample(params)

    @staticmethod
    def _sample(params: list[torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            flat = [p.detach().reshape(-1) for p in params]
            return torch.cat([f[:: max(1, f.numel() // _SAMPLES)].float() for f in flat])

    @classmethod
    def of(cls, model: torch.nn.Module) -> Optional["WeightsStamp"]:
        params = list(model.parameters())
        if any(hasattr(p, "ds_id") for p in params):
            return None
        return cls(params)

    def matches(self, other: Optional["WeightsStamp"]) -> bool:
        if other is None or len(other.params) != len(self.params):
            return False
        if any(a is not b for a, b in zip(self.params, other.params)) or self.meta != other.meta:
            return False
        return torch.equal(self.values, other.values)


class PrefixStore:
    """A few prefixes' KV tensors, least recently used first out, all made by the weights of ``stamp``."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self.stamp: Optional[WeightsStamp] = None
        self.hits = 0  # tokens served from the store (tests, benchmarks)

    def clear(self) -> None:
        self.entries.clear()
        self.stamp = None

    def check(self, model: torch.nn.Module) -> None:
        """Empty the store unless ``model``'s weights are the ones its entries were made with."""
        stamp = WeightsStamp.of(model)
        if stamp is None or not stamp.matches(self.stamp):
            self.entries.clear()
        self.stamp = stamp

    def lookup(self, tokens: Sequence[int]) -> tuple[int, KV]:
        """The longest stored match of ``tokens``' start: ``(length, KV cut to length)``, ``(0, [])`` if none.
        A stored prefix serves any prompt that starts with a part of it (attention is causal)."""
        best, best_key = 0, None
        for key in self.entries:
            n = shared_length(key, tokens)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, []
        self.entries.move_to_end(best_key)
        self.hits += best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in self.entries[best_key]]

    def put(self, tokens: Sequence[int], kv: KV) -> None:
        """Keep ``kv`` as the KV of ``tokens``, unless the weights are unknown (no stamp: nothing is kept)."""
        if self.stamp is None:
            return
        self.entries[tuple(tokens)] = kv
        self.entries.move_to_end(tuple(tokens))
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)


def for_evaluation(rollout_cfg: Any) -> Any:
    """``rollout_cfg`` with the prefix cache on where it says ``auto`` (a copy; the same object otherwise).

    Probes and benchmarks are not training: their numbers need not be the float32 prefill's bit for bit, and
    their prompts share long prefixes (system prompt, few-shot examples). An explicit true or false stays."""
    import copy

    from omegaconf import DictConfig, open_dict

    if prefix_setting(getattr(rollout_cfg, "prefix_cache", "auto")) is not None:
        return rollout_cfg
    cfg = copy.deepcopy(rollout_cfg)
    if isinstance(cfg, DictConfig):
        with open_dict(cfg):
            cfg.prefix_cache = "true"
    else:
        cfg.prefix_cache = "true"
    return cfg
