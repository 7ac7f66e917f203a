"""The ``hf`` backend: a plain sampling loop over a transformers causal LM with a KV cache.

Our own loop rather than ``model.generate``: the behaviour log-prob of each token comes from the logits it was
sampled from, and stop strings end each row of the batch on its own. One step:

    logits_t = model(x_{<t})[-1]                          (float32)
    greedy:  x_t = argmax logits_t,   logp_t = log_softmax(logits_t)[x_t]
    sample:  z = logits_t / T, top-p mask on z (tokens outside the nucleus -> -inf),
             logp = log_softmax(z),  x_t ~ exp(logp),  logp_t = logp[x_t]

Rows (prompt × sample) are batched with left padding; pads are masked out of attention and the position ids count
only real tokens, so a row's result does not depend on its batch-mates. Speed: one prefill per distinct prompt
(:func:`expand_prefill_cache`), a KV cache written in place (:class:`PreallocatedLayer`), no attention mask for
unpadded batches, oneDNN-packed weights on CPU (:func:`packed_linears`) and the shared-prefix cache
(:mod:`unifiedplayers.rollout.prefix_cache`).
"""
from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Any, ContextManager, Optional

import torch
from torch.nn import functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

from unifiedplayers.config import RolloutConfig
from unifiedplayers.models import cache_keyword, forward_overridden, returned_cache
from unifiedplayers.rollout.base import RolloutEngine, register_rollout_engine
from unifiedplayers.rollout.types import Completion, find_stop
from unifiedplayers.rollout.prefix_cache import MIN_PREFIX, PrefixStore, common_prefix_length, prefix_setting


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the nucleus: the smallest set of most likely tokens whose
    probability reaches ``top_p`` (the most likely token is always kept). ``logits``: (B, V)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs`` (B, V) by inverting the CDF with a single uniform per row.

    Same distribution as ``torch.multinomial(probs, 1)``, a fraction of its cost over a 50k vocabulary;
    tokens of probability zero (outside the nucleus) are never drawn.
    """
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, greedy: bool, generator: Optional[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of each row and its behaviour log-prob. ``logits``: (B, V) float32.

    Returns ``(tokens (B,), logprobs (B,))``; the log-prob is under the distribution sampled from
    (temperature and top-p applied; for greedy, the model's own softmax).
    """
    if greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
    else:
        logp = torch.log_softmax(top_p_mask(logits / temperature, top_p), dim=-1)
        tokens = draw(logp.exp(), generator)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _plain_cpu_linear(m: torch.nn.Module, dtypes: tuple[torch.dtype, ...]) -> bool:
    """An ``nn.Linear`` whose weight is a plain 2-D CPU tensor of one of ``dtypes`` (not a ZeRO-3 shard)."""
    w = getattr(m, "weight", None)
    return (isinstance(m, torch.nn.Linear) and isinstance(w, torch.Tensor) and w.dim() == 2
            and w.device.type == "cpu" and w.dtype in dtypes and not hasattr(w, "ds_id"))


PACKABLE = (torch.float32, torch.bfloat16)
PACKED_ROWS = 64  # batches of at most this many rows (the decoding steps) take the packed product
# (out, in, bias, dtype, threads, rows, F.linear) -> whether the packed product is bit-equal to F.linear's there
_PACKING_EXACT: dict[tuple, bool] = {}


def packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch and CPU can multiply by oneDNN-packed copies of linear weights of ``dtype`` (oneDNN's
    bf16 kernels need AVX512-BF16 or AMX; without them a bf16 weight is never packed)."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    return dtype != torch.bfloat16 or bool(getattr(ops, "_is_mkldnn_bf16_supported", lambda: False)())


def packing_probes(dtype: torch.dtype) -> list[bool]:
    """Whether the packed product was bit-exact at each (shape, thread count, rows) probed so far for weights of
    ``dtype``: ``packed_linears=auto`` packs only where it was (read-only, for reports)."""
    return [exact for key, exact in _PACKING_EXACT.items() if key[3] == dtype]


def _exact_key(module: torch.nn.Linear, rows: int) -> tuple:
    w = module.weight
    # F.linear too: DeepSpeed's ZeRO-3 replaces it process-wide (its own matmul), and the probe compares with it
    return (*w.shape, module.bias is not None, w.dtype, torch.get_num_threads(), rows, F.linear)


def _packing_exact(module: torch.nn.Linear, packed: torch.Tensor, rows: int) -> bool:
    """Whether the packed product of ``module`` is bit-equal to ``F.linear`` for ``rows`` rows: probed once per
    shape, dtype, bias, thread count and row count with random rows (oneDNN picks its kernel and its split of the
    sums by shape and threads, never by values), with a generator of its own (the run's streams are untouched)."""
    w = module.weight
    key = _exact_key(module, rows)
    if key not in _PACKING_EXACT:
        x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(rows)).to(w.dtype)
        with torch.no_grad():
            _PACKING_EXACT[key] = torch.equal(_packed_product(module, packed, x), F.linear(x, module.weight, module.bias))
    return _PACKING_EXACT[key]


_PACKING_WARNED: list[str] = []


def _warn_packing_once(err: Exception) -> None:
    if not _PACKING_WARNED:
        _PACKING_WARNED.append(str(err))
        warnings.warn(f"rollout.packed_linears: packing the linear weights failed ({type(err).__name__}: {err}); "
                      "decoding uses the unpacked product", RuntimeWarning, stacklevel=3)


def _packed_product(module: torch.nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")


def packed_linears(model: torch.nn.Module, setting: Optional[bool]) -> ContextManager[None]:
    """While inside, the CPU float32/bfloat16 ``nn.Linear`` layers of ``model`` multiply a batch of at most
    :data:`PACKED_ROWS` rows (the decoding steps) by a copy of their weight packed once for oneDNN, instead of
    repacking it at every call (``F.linear``), which is most of the cost of a decoding step's small products.
    Larger batches (prefills) keep ``F.linear``.
    ``setting`` (``rollout.packed_linears``): None (auto) uses the packed product only at the row counts where it
    is bit-equal to ``F.linear`` (:func:`_packing_exact`; bfloat16 here, the same oneDNN kernel); True at
    every row count (float32 then rounds differently from ``F.linear``); False never. The copies (one
    more copy of the weights) are made on entry, so they hold the weights of this call, and dropped on exit. A
    layer oneDNN cannot pack or multiply leaves every layer unpacked, with one warning."""
    if setting is False:
        return contextlib.nullcontext()
    packed: dict[torch.nn.Module, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for m in model.modules():
                if (_plain_cpu_linear(m, PACKABLE) and packing_available(m.weight.dtype)
                        and (setting or _PACKING_EXACT.get(_exact_key(m, 1)) is not False)):  # known inexact: no copy
                    p = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 8)
                    if setting or _packing_exact(m, p, 1):  # never exact at one row: not worth packing (float32)
                        _packed_product(m, p, torch.zeros(1, m.weight.shape[1], dtype=m.weight.dtype))  # runs
                        packed[m] = p
    except RuntimeError as err:  # a CPU or build whose oneDNN cannot pack this layer: the unpacked product
        _warn_packing_once(err)
        return contextlib.nullcontext()

    def forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if (rows > PACKED_ROWS or x.dtype != module.weight.dtype
                or not (setting or _packing_exact(module, packed[module], rows))):
            return F.linear(x, module.weight, module.bias)
        return _packed_product(module, packed[module], x)

    return forward_overridden(list(packed), forward)


def _forward_keywords(model: Any) -> tuple[str, dict[str, Any]]:
    """The forward() keyword of the KV cache and the prefill's extra keywords (``logits_to_keep=1`` where
    the model takes it: only the last position's logits are needed)."""
    params = inspect.signature(model.forward).parameters
    return cache_keyword(model), ({"logits_to_keep": 1} if "logits_to_keep" in params else {})


class PreallocatedLayer(DynamicLayer):
    """A transformers cache layer whose keys and values live in buffers with room to grow (transformers' own
    concatenates, copying the whole cache at every step): ``update`` writes the new positions in place and returns
    views of the filled part. A full buffer is replaced by one twice as long (up to ``limit`` positions), so the
    copies stay amortised O(1) per step and sequences that stop early never reserve their whole budget."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, limit: int, room: int = 256) -> None:
        super().__init__()
        self.length, self.limit = keys.shape[2], limit
        self._keys, self._values = keys, values
        self._reserve(min(limit, self.length + room))
        self.device, self.is_initialized = keys.device, True

    def _reserve(self, capacity: int) -> None:
        keys = self._keys.new_empty((*self._keys.shape[:2], capacity, self._keys.shape[3]))
        values = self._values.new_empty((*self._values.shape[:2], capacity, self._values.shape[3]))
        keys[:, :, : self.length] = self._keys[:, :, : self.length]
        values[:, :, : self.length] = self._values[:, :, : self.length]
        self._keys, self._values = keys, values
        self.keys, self.values = keys[:, :, : self.length], values[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[2]:
            if end > self.limit:
                raise RuntimeError(f"KV cache limited to {self.limit} positions, asked for {end}")
            self._reserve(min(self.limit, max(end, 2 * self._keys.shape[2])))
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def expand_prefill_cache(cache: Any, rows: torch.Tensor, limit: int) -> bool:
    """Turn the cache of a prefill over distinct prompts into the cache of the batch's rows (row ``b`` continues
    prompt ``rows[b]``), each layer a :class:`PreallocatedLayer` of at most ``limit`` positions. False (cache
    untouched) when the cache is not made of plain dynamic layers (sliding windows)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return False
    for i, layer in enumerate(layers):
        cache.layers[i] = PreallocatedLayer(layer.keys.index_select(0, rows), layer.values.index_select(0, rows), limit)
    return True


@register_rollout_engine("hf")
class HFRollout(RolloutEngine):
    """Generation with the trainer's own module: :meth:`update_weights` only re-binds it."""

    backend = "hf"
    samples_from_module = True

    def __init__(self, cfg: RolloutConfig, model: Any, tokenizer: Any) -> None:
        super().__init__(cfg, model, tokenizer)
        if cfg.batch_size < 0:
            raise ValueError(f"rollout.batch_size={cfg.batch_size}: need >= 0 (0 = all rows in one batch)")
        self._prefix_setting = prefix_setting(getattr(cfg, "prefix_cache", "auto"))
        self._packed_setting = prefix_setting(getattr(cfg, "packed_linears", "auto"), "rollout.packed_linears")
        self._prefixes = PrefixStore()
        self._cache_arg, self._prefill_kw = _forward_keywords(model)

    @property
    def packed_linears_setting(self) -> Optional[bool]:
        """``rollout.packed_linears`` as resolved: True, False, or None for auto."""
        return self._packed_setting

    def update_weights(self, model: Any) -> None:
        # The hf engine samples from the module it is given: the trainer's updates are already there
        # when it is the same object; a different object (e.g. a reloaded checkpoint) replaces it.
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"the hf engine samples from a module; got {type(model).__name__}")
        if model is not self.model:
            self._prefixes.clear()
        self.model = model
        self._cache_arg, self._prefill_kw = _forward_keywords(model)

    def forget_prefixes(self) -> None:
        """Drop the stored prompt prefixes: the caller knows the weights changed (a new checkpoint name), which
        a backend that writes weights without touching the parameters' version counters (ZeRO) would hide."""
        self._prefixes.clear()

    def _vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(int(t) for t in gen_eos)
        return ids

    def prefix_cache_on(self) -> bool:
        """Whether calls share prompt prefixes (``rollout.prefix_cache``; auto: when the model does not sample in
        float32, whose arithmetic then stays exactly that of a whole-prompt prefill)."""
        on = self._prefix_setting
        if on is None:
            on = next(self.model.parameters()).dtype != torch.float32
        return on and _plain_cache(self.model)

    def _generate_ids(self, prompt_ids, n, max_new_tokens, temperature, top_p, stop, greedy, seed, ignore_eos):
        device = next(self.model.parameters()).device
        generator = None
        if seed is not None and not greedy:
            generator = torch.Generator(device=device)
            generator.manual_seed(int(seed))
        prefixes = None
        if self.prefix_cache_on():
            self._prefixes.check(self.model)  # once per call: the weights do not change during one
            prefixes = self._prefixes
        # One row per (prompt, sample); rows of similar length share a batch to limit padding.
        rows = [(p, ids) for p, ids in enumerate(prompt_ids) for _ in range(n)]
        order = sorted(range(len(rows)), key=lambda r: len(rows[r][1]))
        chunk = self.cfg.batch_size or len(rows)
        results: list[Optional[Completion]] = [None] * len(rows)
        was_training = self.model.training
        self.model.eval()
        try:
            with packed_linears(self.model, self._packed_setting):
                for start in range(0, len(order), chunk):
                    idx = order[start : start + chunk]
                    outs = self._sample_batch([rows[r][1] for r in idx], max_new_tokens, temperature, top_p, stop,
                                              greedy, generator, ignore_eos, device, prefixes)
                    for r, c in zip(idx, outs):
                        results[r] = c
        finally:
            self.model.train(was_training)
        return [results[p * n : (p + 1) * n] for p in range(len(prompt_ids))]

    @torch.inference_mode()
    def _sample_batch(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                      stop: list[str], greedy: bool, generator: Optional[torch.Generator], ignore_eos: bool,
                      device: torch.device, prefixes: Optional[PrefixStore] = None) -> list[Completion]:
        budgets = self._budgets(prompts, max_new_tokens)
        eos = set() if ignore_eos else self._eos_ids()
        batch, width, steps = len(prompts), max(len(p) for p in prompts), max(budgets)
        padded = any(len(p) != width for p in prompts)
        cache, logits, positions, attention = self._prefill(prompts, width, steps, padded, device, prefixes)
        full_attention = None
        if padded:  # the attention mask of every step, filled in advance: pads 0, everything after them 1
            full_attention = attention.new_ones((batch, width + steps))
            full_attention[:, :width] = attention
        next_pos = positions[:, -1:] + 1
        rows = _Rows(batch, budgets, eos, stop, self.tokenizer)

        for step in range(steps):
            nxt, lp = sample_next(logits.float(), temperature, top_p, greedy, generator)
            if rows.record(nxt.tolist(), lp.tolist()):
                break
            # Every row steps until the last one ends; an ended row's tokens are no longer recorded.
            step_ids = torch.tensor(rows.last_tokens(), dtype=torch.long, device=device)[:, None]
            out = self.model(
                input_ids=step_ids,
                attention_mask=full_attention[:, : width + step + 1] if padded else None,
                position_ids=next_pos,
                use_cache=True,
                **{self._cache_arg: cache},
            )
            cache, logits = returned_cache(out), out.logits[:, -1, :]
            next_pos = next_pos + 1
        return rows.completions(prompts)

    def _budgets(self, prompts: list[list[int]], max_new_tokens: int) -> list[int]:
        """Each row's number of new tokens: ``max_new_tokens``, or less where the model's context ends first
        (a prompt that fills the context is an error)."""
        max_pos = getattr(self.model.config, "max_position_embeddings", None)
        budgets = []
        for ids in prompts:
            budget = max_new_tokens
            if max_pos is not None:
                if len(ids) >= max_pos:
                    raise ValueError(f"a prompt of {len(ids)} tokens leaves no room in the model's context of {max_pos}")
                budget = min(budget, max_pos - len(ids))
            budgets.append(budget)
        return budgets

    def _prefill(
        self, prompts: list[list[int]], width: int, steps: int, padded: bool, device: torch.device,
        prefixes: Optional[PrefixStore] = None,
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The forward pass over the batch's prompts, left-padded to ``width``: one row per distinct prompt
        (the n samples of a prompt share it).

        With ``prefixes`` (the prefix cache on), the distinct prompts' common prefix, when long enough, is
        prefilled once (or taken from ``prefixes``) and only the rest of each prompt on top of it; a row then
        reads ``[prefix | pads | own tokens]``, the pads masked and not counted in the position ids.

        Returns ``(cache, logits (B, V), position ids (B, width), attention (B, width))``, one row per
        row of the batch, the cache with room for ``width + steps`` positions where it is preallocated.
        """
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(ids), len(distinct)) for ids in prompts]
        prefill = [list(ids) for ids in distinct]
        shared = common_prefix_length(prefill) if prefixes is not None else 0
        past = self._prefix_cache(prefixes, prefill[0][:shared], len(prefill), device) if shared >= MIN_PREFIX else None
        shared = shared if past is not None else 0
        input_ids, attention = _pad_rows(prefill, width, pad, shared)
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        out = self.model(
            input_ids=input_ids[:, shared:],
            attention_mask=attention if padded else None,  # no padding: plain causal attention
            position_ids=positions[:, shared:],
            use_cache=True,
            **({self._cache_arg: past} if past is not None else {}),
            **self._prefill_kw,
        )
        cache, logits = returned_cache(out), out.logits[:, -1, :]
        rows = torch.tensor(row_of, dtype=torch.long, device=device)
        if not expand_prefill_cache(cache, rows, width + steps):
            cache.batch_select_indices(rows)
        logits, positions, attention = (t.index_select(0, rows) for t in (logits, positions, attention))
        return cache, logits, positions, attention

    def _prefix_cache(self, prefixes: PrefixStore, tokens: list[int], rows: int, device: torch.device) -> Any:
        """A KV cache of ``rows`` rows holding ``tokens``' keys and values, computed past their longest match in
        ``prefixes`` and kept there; None where the model's cache is not made of plain dynamic layers (sliding
        windows): those prompts are prefilled whole."""
        have, kv = prefixes.lookup(tokens)
        if have < len(tokens):
            out = self.model(
                input_ids=torch.tensor([tokens[have:]], dtype=torch.long, device=device),
                position_ids=torch.arange(have, len(tokens), device=device)[None],
                use_cache=True,
                **({self._cache_arg: _dynamic_cache(kv, 1)} if have else {}),
                **self._prefill_kw,
            )
            layers = getattr(returned_cache(out), "layers", None)
            if not layers or any(type(layer) is not DynamicLayer for layer in layers):
                return None
            kv = [(layer.keys, layer.values) for layer in layers]
            prefixes.put(tokens, kv)
        return _dynamic_cache(kv, rows)


def _plain_cache(model: Any) -> bool:
    """Whether the model's own KV cache is made of plain dynamic layers (no sliding windows), the kind
    :func:`_dynamic_cache` builds."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _dynamic_cache(kv: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> Any:
    """A transformers DynamicCache holding one row's ``kv`` (per layer) repeated over ``rows`` rows."""
    cache = DynamicCache()
    for i, (keys, values) in enumerate(kv):
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), i)
    return cache


def _pad_rows(prompts: list[list[int]], width: int, pad: int, shared: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention)`` (rows, width) of ``prompts`` laid out ``[first shared tokens | pads | rest]``
    (``shared=0``: plain left padding), the attention 0 on pads."""
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, ids in enumerate(prompts):
        own = len(ids) - shared
        input_ids[b, :shared] = torch.tensor(ids[:shared], dtype=torch.long)
        input_ids[b, width - own :] = torch.tensor(ids[shared:], dtype=torch.long)
        attention[b, :shared] = 1
        attention[b, width - own :] = 1
    return input_ids, attention


class _Rows:
    """What each row of a batch has produced so far: its tokens and their log-probs, its decoded text
    (kept only when there are stop strings), where a stop string ended it, and why it ended (None while
    it runs)."""

    def __init__(self, batch: int, budgets: list[int], eos: set[int], stop: list[str], tokenizer: Any) -> None:
        self.budgets, self.eos, self.stop, self.tokenizer = budgets, eos, stop, tokenizer
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.logps: list[list[float]] = [[] for _ in range(batch)]
        self.texts = [""] * batch
        self.finish: list[Optional[str]] = [None] * batch
        self.stop_at: list[Optional[tuple[int, str]]] = [None] * batch
        self.longest_stop = max((len(s) for s in stop), default=0)

    def record(self, nxt_list: list[int], lp_list: list[float]) -> bool:
        """Append one step's token and log-prob to every running row and end the rows it ends (eos, a stop
        string, the row's budget). True when every row has ended."""
        tokens, logps, texts, finish, stop = self.tokens, self.logps, self.texts, self.finish, self.stop
        for b, (token, logp) in enumerate(zip(nxt_list, lp_list)):
            if finish[b] is not None:
                continue
            tokens[b].append(token)
            logps[b].append(logp)
            if token in self.eos:
                finish[b] = "stop"
                continue
            if stop:
                text = self.tokenizer.decode(tokens[b], skip_special_tokens=True)
                # Earlier characters can change only where an incomplete UTF-8 sequence completes.
                hit = find_stop(text, stop, max(0, len(texts[b]) - self.longest_stop - 4))
                texts[b] = text
                if hit is not None:
                    finish[b], self.stop_at[b] = "stop", hit
                    continue
            if len(tokens[b]) >= self.budgets[b]:
                finish[b] = "length"
        return all(f is not None for f in finish)

    def last_tokens(self) -> list[int]:
        """The last token of each row, ended ones included."""
        return [t[-1] for t in self.tokens]

    def completions(self, prompts: list[list[int]]) -> list[Completion]:
        """One :class:`Completion` per row, its text cut right after the stop string that ended it."""
        results = []
        for b in range(len(self.tokens)):
            if self.stop_at[b] is not None:
                end, s = self.stop_at[b]
                text = self.texts[b][:end]
            else:
                s, text = None, self.tokenizer.decode(self.tokens[b], skip_special_tokens=True)
            results.append(Completion(prompt_ids=list(prompts[b]), token_ids=self.tokens[b], text=text,
                                      logprobs=self.logps[b], finish_reason=self.finish[b] or "length", stop_str=s))
        return results
