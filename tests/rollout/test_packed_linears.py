"""The hf engine's packed linear layers (``rollout.packed_linears``, :func:`hf_engine.packed_linears`):
oneDNN-packed weight copies for the decoding steps' small products. In bfloat16 (auto) they must give the very
tokens and log-probs of the unpacked engine; float32 is packed only when asked; large batches (prefill) and the
layers' own forwards are left as they were. Each test names the plant it catches."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from unifiedplayers.config import RolloutConfig
from unifiedplayers.models import cast_parameters
from unifiedplayers.rollout import build_rollout
from unifiedplayers.rollout import hf_engine
from unifiedplayers.rollout.hf_engine import PACKED_ROWS, packed_linears
from tests.rollout.test_hf_decoding import one_thread, tiny  # noqa: E402,F401

pytestmark = pytest.mark.skipif(not hf_engine.packing_available(), reason="torch built without oneDNN")


@pytest.fixture(autouse=True)
def plain_linear(monkeypatch):
    """The aten linear as ``F.linear``: DeepSpeed's ZeRO-3, set up by another test of the same process, leaves its
    own matmul-based ``F.linear`` in place, with which the packed product is not bit-equal (and so not used)."""
    monkeypatch.setattr(torch.nn.functional, "linear", torch._C._nn.linear)


# bf16 weights are packed only where oneDNN has native bf16 (AVX512-BF16 or AMX): elsewhere auto never packs them.
needs_bf16 = pytest.mark.skipif(not hf_engine.packing_available(torch.bfloat16),
                                reason="no native bf16 on this CPU: bf16 weights are never packed")


def require_exact(model: torch.nn.Module, rows) -> None:
    """Skip unless this CPU's packed bf16 product is bit-equal to ``F.linear`` at every row count of ``rows`` for
    every layer of ``model`` (then auto packs there; elsewhere, an AMX kernel choice for one, it rightly does not,
    and a test of the packed path has nothing to test)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.bfloat16:
            packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 8)
            if not all(hf_engine._packing_exact(m, packed, r) for r in rows):
                pytest.skip("this CPU's packed bf16 product is not F.linear's at these row counts: auto never uses it")


def net_of(dtype: torch.dtype) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 32, bias=False)).to(dtype)


def packed_calls(monkeypatch, *models: torch.nn.Module) -> list[int]:
    """Record the rows of every packed product from now on, ``models``' exactness self-checks done beforehand (so
    that their probes are not recorded)."""
    for model in models:
        with packed_linears(model, None):
            pass
    calls: list[int] = []
    product = hf_engine._packed_product

    def recorded(m, p, x):
        if sys._getframe(1).f_code.co_name == "forward":  # a layer's product, not an exactness probe
            calls.append(x.numel() // x.shape[-1])
        return product(m, p, x)

    monkeypatch.setattr(hf_engine, "_packed_product", recorded)
    return calls


@needs_bf16
@pytest.mark.parametrize("rows", [(1,), (3,), (2, 5), (PACKED_ROWS + 1,)])
def test_bf16_packed_layers_give_the_linear_values_bit_for_bit_and_are_restored(rows, monkeypatch):
    """Catches a packed copy of another layer's weight (or the wrong orientation), a dropped bias, and forwards
    left patched on exit."""
    net = net_of(torch.bfloat16)
    x = torch.randn(*rows, 64).to(torch.bfloat16)
    require_exact(net, {1, x.numel() // 64} - {PACKED_ROWS + 1})
    want = net(x)
    calls = packed_calls(monkeypatch, net)
    with packed_linears(net, None):
        assert all("forward" in m.__dict__ for m in net)
        got = net(x)
    assert all("forward" not in m.__dict__ for m in net)
    assert torch.equal(got, want)
    # Only batches of at most PACKED_ROWS rows take the packed product (a prefill keeps F.linear).
    assert calls == ([] if rows[0] > PACKED_ROWS else [x.numel() // 64] * 2)


def test_float32_is_packed_only_when_asked_and_large_batches_keep_f_linear(monkeypatch):
    """Catches auto packing float32 where its packed product rounds differently from ``F.linear``, True not packing,
    and a prefill-sized batch going through the packed product (the row limit dropped)."""
    net = net_of(torch.float32)
    small, large = torch.randn(4, 64), torch.randn(PACKED_ROWS + 1, 64)
    own_small, own_large = net(small), net(large)
    calls = packed_calls(monkeypatch, net)
    with packed_linears(net, None):  # auto: exact whatever it packs
        assert torch.equal(net(small), own_small)
    calls.clear()
    with packed_linears(net, True):
        got_small, got_large = net(small), net(large)
    assert calls == [4, 4]
    assert torch.allclose(got_small, own_small, atol=1e-5, rtol=1e-5) and torch.equal(got_large, own_large)
    with packed_linears(net, False):
        assert all("forward" not in m.__dict__ for m in net)


@needs_bf16
def test_auto_packs_only_layers_whose_packed_product_is_exact(monkeypatch):
    """Catches a self-check that is skipped or always passes: a packed product one ulp off is not used by auto,
    but is by True."""
    monkeypatch.setattr(hf_engine, "_PACKING_EXACT", {})
    product = hf_engine._packed_product
    monkeypatch.setattr(hf_engine, "_packed_product", lambda m, p, x: product(m, p, x) * (1 + 2 ** -7))
    net = net_of(torch.bfloat16)
    with packed_linears(net, None):
        assert all("forward" not in m.__dict__ for m in net)
    probes = hf_engine.packing_probes(torch.bfloat16)
    assert probes and not any(probes) and hf_engine.packing_probes(torch.float32) == []
    with packed_linears(net, True):
        assert all("forward" in m.__dict__ for m in net)


@needs_bf16
def test_a_row_count_whose_packed_product_is_not_exact_keeps_the_own_product(monkeypatch):
    """Catches exactness probed at a few row counts and trusted at others: oneDNN may pick another kernel, or split
    the sums otherwise, at another row count (more threads, AMX). Planted: the packed product is one ulp off at 5
    rows only; auto must then use the packed product at 3 rows and the unpacked one at 5."""
    require_exact(net_of(torch.bfloat16), [1, 3])
    monkeypatch.setattr(hf_engine, "_PACKING_EXACT", {})
    product = hf_engine._packed_product
    monkeypatch.setattr(hf_engine, "_packed_product",
                        lambda m, p, x: product(m, p, x) * (1 + 2 ** -7) if x.numel() // x.shape[-1] == 5
                        else product(m, p, x))
    net = net_of(torch.bfloat16)
    three, five = torch.randn(3, 64).to(torch.bfloat16), torch.randn(5, 64).to(torch.bfloat16)
    want_three, want_five = net(three), net(five)
    calls = packed_calls(monkeypatch, net)
    with packed_linears(net, None):
        assert torch.equal(net(three), want_three) and torch.equal(net(five), want_five)
    assert calls == [3, 3]


def generate(model, tok, setting: str, **kw):
    cfg = RolloutConfig(batch_size=0, prefix_cache="false", packed_linears=setting)
    prompts = [tok.encode("hello world, this is")[:6], tok.encode("one")[:2], tok.encode("a b c d e f g h")[:9]]
    return build_rollout(cfg, model, tok).generate(prompts, **kw)


def exactly_equal(a, b) -> bool:
    return all(x.token_ids == y.token_ids and x.logprobs == y.logprobs and x.finish_reason == y.finish_reason
               for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@needs_bf16
@pytest.mark.parametrize("kw", [dict(n=3, max_new_tokens=12, temperature=1.0, seed=3, ignore_eos=True),
                                dict(n=1, max_new_tokens=12, greedy=True, ignore_eos=True)])
def test_bf16_engine_with_packed_layers_gives_the_same_tokens_and_logprobs(tiny, monkeypatch, kw):
    """The engine's default (auto) in bfloat16 packs every linear layer of the decoding steps and changes no token
    and no log-prob bit. Catches auto resolved as off, and any packed product that is not the unpacked one."""
    model, tok = tiny
    half = cast_parameters(copy.deepcopy(model), torch.bfloat16)
    require_exact(half, range(1, PACKED_ROWS + 1))
    plain = generate(half, tok, "false", **kw)
    calls = packed_calls(monkeypatch, half)
    packed = generate(half, tok, "auto", **kw)
    assert exactly_equal(packed, plain)
    layers = sum(isinstance(m, torch.nn.Linear) for m in half.modules())
    assert len(calls) >= layers * (kw["max_new_tokens"] - 1)  # every layer at every decoding step
    assert all("forward" not in m.__dict__ for m in half.modules())


def test_float32_engine_is_unchanged_by_auto_and_close_with_true(tiny, monkeypatch):
    model, tok = tiny
    kw = dict(n=2, max_new_tokens=10, temperature=1.0, seed=1, ignore_eos=True)
    plain = generate(model, tok, "false", **kw)
    calls = packed_calls(monkeypatch, model)
    assert exactly_equal(generate(model, tok, "auto", **kw), plain)  # auto: exact whatever it packs
    calls.clear()
    forced = generate(model, tok, "true", **kw)
    assert calls
    for ra, rb in zip(forced, plain):
        for x, y in zip(ra, rb):
            assert x.token_ids == y.token_ids
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)


def test_packed_linears_setting_is_checked(tiny):
    model, tok = tiny
    cfg = RolloutConfig()
    cfg.packed_linears = "sometimes"
    with pytest.raises(ValueError, match="rollout.packed_linears"):
        build_rollout(cfg, model, tok)
    settings = {}
    for value in ("auto", "true", "false"):
        cfg.packed_linears = value
        settings[value] = build_rollout(cfg, model, tok).packed_linears_setting
    assert settings == {"auto": None, "true": True, "false": False}


def test_a_replaced_f_linear_is_probed_again(monkeypatch):
    """Catches an exactness answer cached for one ``F.linear`` and trusted after another replaced it (DeepSpeed's
    ZeRO-3 does, process-wide): the probe must compare with the product the layer would compute now."""
    net = net_of(torch.bfloat16)
    x = torch.randn(3, 64).to(torch.bfloat16)
    with packed_linears(net, None):
        net(x)  # exact with the aten linear: cached
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w, b=None: torch._C._nn.linear(x, w, b) * (1 + 2 ** -7))
    want = net(x)
    with packed_linears(net, None):
        assert torch.equal(net(x), want)


@needs_bf16
def test_auto_never_copies_a_weight_it_knows_is_not_exact(monkeypatch):
    """Catches a layer whose packed product is not exact (float32 here: F.linear's product is MKL's) paying a
    packed copy of its weight at every call only to throw it away: the default float32 rollouts of a CPU without
    native bf16 must not get slower. Planted: a packed product one ulp off."""
    monkeypatch.setattr(hf_engine, "_PACKING_EXACT", {})
    product = hf_engine._packed_product
    monkeypatch.setattr(hf_engine, "_packed_product", lambda m, p, x: product(m, p, x) * (1 + 2 ** -7))
    net = net_of(torch.bfloat16)
    with packed_linears(net, None):  # probes once: not exact
        pass
    reorders = []
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda *a: (reorders.append(1), reorder(*a))[1], raising=False)
    with packed_linears(net, None):
        assert all("forward" not in m.__dict__ for m in net)
    assert reorders == []
    with packed_linears(net, True):
        pass
    assert len(reorders) == 2


@needs_bf16
def test_a_packing_failure_falls_back_to_the_unpacked_product_with_one_warning(monkeypatch):
    """Catches a CPU or torch build whose oneDNN cannot pack a layer crashing the rollout instead of decoding
    unpacked."""
    def refuse(*args, **kwargs):
        raise RuntimeError("no packing kernel for this CPU")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse, raising=False)
    monkeypatch.setattr(hf_engine, "_PACKING_WARNED", [])
    net = net_of(torch.bfloat16)
    x = torch.randn(3, 64).to(torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="rollout.packed_linears: packing the linear weights failed"):
        with packed_linears(net, None):
            assert all("forward" not in m.__dict__ for m in net)  # nothing overridden
            got = net(x)
    assert torch.equal(got, net(x))
    with packed_linears(net, True):  # warned once per process
        pass
