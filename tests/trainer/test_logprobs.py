"""Token log-probs of the trainer: only the selected rows reach the LM head, chunked or not."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn import functional as F

from unifiedplayers.trainer import build_trainer, selected_token_logprobs

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config

pytestmark = pytest.mark.cpu


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 259, (3, 11), generator=g)
    att = torch.ones_like(ids)
    att[2, 8:] = 0  # right padding
    sel = (torch.rand(3, 11, generator=g) > 0.3) & att.bool()
    sel[:, 0] = False
    return ids, att, sel


def test_selected_logprobs_match_full_logits_with_temperature():
    model, _ = tiny_model()
    ids, att, sel = _inputs()
    with torch.no_grad():
        out = selected_token_logprobs(model, ids, att, sel, with_entropy=True, temperature=0.7)
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits.float() / 0.7, -1)
    # Position t - 1 predicts token t.
    expected = torch.zeros(3, 11)
    expected[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    expected_ent = torch.zeros(3, 11)
    expected_ent[:, 1:] = -(logp.exp() * logp).sum(-1)[:, :-1]
    torch.testing.assert_close(out.logprobs, expected * sel, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy, expected_ent * sel, atol=1e-5, rtol=0)


def test_first_token_cannot_be_selected():
    model, _ = tiny_model()
    ids, att, sel = _inputs()
    sel[1, 0] = True
    with pytest.raises(ValueError, match="first token"):
        selected_token_logprobs(model, ids, att, sel)


def test_chunked_head_equals_plain_head_values_and_gradients():
    ids, att, sel = _inputs()
    weights = torch.randn(3, 11, generator=torch.Generator().manual_seed(1))
    results = []
    for chunk in (0, 4):
        model, _ = tiny_model()
        out = selected_token_logprobs(model, ids, att, sel, with_entropy=True, temperature=0.7, chunk_rows=chunk)
        (out.logprobs * weights).sum().backward()
        results.append((out.logprobs.detach(), out.entropy, {k: p.grad for k, p in model.named_parameters()}))
    (lp0, e0, g0), (lp1, e1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-6, rtol=0)
    torch.testing.assert_close(e1, e0, atol=1e-6, rtol=0)
    assert float(g0["lm_head.weight"].abs().max()) > 0
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], atol=1e-5, rtol=1e-5)


def test_trainer_with_chunked_head_matches_plain():
    src, _ = tiny_model()
    batch = synthetic_batch(src, torch.Generator().manual_seed(2))
    metrics = []
    for chunk in (0, 5):
        model, _ = tiny_model()
        trainer = build_trainer(trainer_config(logprob_chunk_rows=chunk), model)
        trainer.start_outer_iteration()
        metrics.append(trainer.update(batch))
    assert metrics[1]["actor/loss"] == pytest.approx(metrics[0]["actor/loss"], abs=1e-6)
    assert metrics[1]["actor/grad_norm"] == pytest.approx(metrics[0]["actor/grad_norm"], rel=1e-5)
    assert metrics[1]["actor/entropy"] == pytest.approx(metrics[0]["actor/entropy"], rel=1e-5)


def _reference_logprobs(model, ids, att, sel, temperature):
    """log_softmax over the full logits of a plain forward (autograd all the way)."""
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits.float() / temperature, -1)
    out = torch.zeros(ids.shape)
    out[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return out * sel


def test_head_logprob_gradients_equal_plain_autograd():
    ids, att, sel = _inputs()
    weights = torch.randn(3, 11, generator=torch.Generator().manual_seed(3))
    model, _ = tiny_model()
    (_reference_logprobs(model, ids, att, sel, 0.7) * weights).sum().backward()
    expected = {k: p.grad for k, p in model.named_parameters()}
    for chunk in (0, 4):  # 0: softmax kept from the forward; 4: recomputed chunk by chunk
        model, _ = tiny_model()
        out = selected_token_logprobs(model, ids, att, sel, temperature=0.7, chunk_rows=chunk)
        (out.logprobs * weights).sum().backward()
        for k, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[k], atol=1e-5, rtol=1e-4)


def test_shared_prompt_runs_once_with_the_same_values_and_gradients():
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 259, (20,), generator=g)
    ids = torch.cat([prompt.expand(4, -1), torch.randint(3, 259, (4, 9), generator=g)], dim=1)
    att = torch.ones_like(ids)
    att[1, 25:] = 0  # right padding
    sel = torch.zeros_like(ids, dtype=torch.bool)
    sel[:, 18:] = True  # two prompt tokens are trained too (positions inside the shared prefix)
    sel &= att.bool()
    weights = torch.randn(ids.shape, generator=g)
    results = []
    for min_shared_prefix in (0, 16):
        model, _ = tiny_model()
        shapes = []
        model.model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
        out = selected_token_logprobs(model, ids, att, sel, with_entropy=True, min_shared_prefix=min_shared_prefix)
        (out.logprobs * weights).sum().backward()
        assert shapes == ([(4, 29)] if min_shared_prefix == 0 else [(1, 20), (4, 9)])
        results.append((out.logprobs.detach(), out.entropy, {k: p.grad for k, p in model.named_parameters()}))
    (lp0, e0, g0), (lp1, e1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=0)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], atol=1e-5, rtol=1e-4)


def test_shared_prefix_length():
    from unifiedplayers.trainer.logprobs import shared_prefix_length

    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 8], [5, 6, 7, 0]])
    assert shared_prefix_length(ids, torch.ones_like(ids)) == 2
    assert shared_prefix_length(ids[[0, 0]], torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])) == 3  # pads never shared


@pytest.mark.parametrize("part", ["mlp", "norm"])
def test_lean_layers_equal_the_models_own_values_and_gradients_and_keep_less(part):
    from unifiedplayers.trainer.logprobs import lean_layers

    model, _ = tiny_model()
    module = model.model.layers[0].mlp if part == "mlp" else model.model.layers[1].post_attention_layernorm
    if part == "norm":  # the tiny model's norms start at weight 1
        with torch.no_grad():
            module.weight.copy_(torch.randn(module.weight.shape, generator=torch.Generator().manual_seed(7)))
    hidden, inner, rows = model.config.hidden_size, model.config.intermediate_size, 10
    x = torch.randn(2, 5, hidden, generator=torch.Generator().manual_seed(5), requires_grad=True)
    grad_out = torch.randn(2, 5, hidden, generator=torch.Generator().manual_seed(6))
    results = []
    for lean in (False, True):
        module.zero_grad(set_to_none=True)
        x.grad = None
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
            with lean_layers(model) if lean else contextlib.nullcontext():
                y = module(x)
        assert "forward" not in module.__dict__  # restored on exit
        y.backward(grad_out)
        results.append((y.detach(), x.grad.clone(), {k: p.grad.clone() for k, p in module.named_parameters()}, sum(kept)))
    (y0, gx0, g0, kept0), (y1, gx1, g1, kept1) = results
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    torch.testing.assert_close(gx1, gx0, atol=1e-6, rtol=1e-5)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], atol=1e-6, rtol=1e-5)
    if part == "mlp":  # the input, the three weights, the gate and the up projection
        assert kept1 == rows * hidden + 3 * hidden * inner + 2 * rows * inner
        assert kept0 >= kept1 + 2 * rows * inner  # autograd: also silu(gate) and the product
    else:  # the input, the weight and one 1/rms per row
        assert kept1 == rows * hidden + hidden + rows
        assert kept0 >= 2 * rows * hidden  # autograd: the input and the normalised rows at least


def test_lean_mlp_gradients_are_autograds_bit_for_bit_in_bf16():
    # The lean backward recomputes silu(gate) with the forward's own op and takes silu's derivative with autograd's
    # own fused op, so in bf16 too its gradients are autograd's, not a differently rounded chain of bf16 products.
    # The input gradient runs the very products autograd runs (grad @ W): equal on any CPU. The weight gradients
    # are dᵀ x here and (xᵀ d)ᵀ in autograd, a layout whose rounding may differ on a CPU without native bf16, so
    # W_down's is held bit for bit to dᵀ (silu(x W_gᵀ) ⊙ x W_uᵀ) built from the forward's own ops, and the other
    # two to autograd's within one bf16 rounding.
    from unifiedplayers.trainer.logprobs import lean_layers

    model, _ = tiny_model()
    model = model.to(torch.bfloat16)
    module = model.model.layers[0].mlp
    x0 = torch.randn(2, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(5)).bfloat16()
    grad_out = torch.randn(2, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(6)).bfloat16()
    results = []
    for lean in (False, True):
        module.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        with lean_layers(model) if lean else contextlib.nullcontext():
            y = module(x)
        y.backward(grad_out)
        results.append((y.detach(), x.grad, {k: p.grad for k, p in module.named_parameters()}))
    (y0, gx0, g0), (y1, gx1, g1) = results
    assert torch.equal(y1, y0) and torch.equal(gx1, gx0)
    with torch.no_grad():
        product = F.silu(F.linear(x0, module.gate_proj.weight)) * F.linear(x0, module.up_proj.weight)
        expected_down = grad_out.reshape(-1, grad_out.shape[-1]).t() @ product.reshape(-1, product.shape[-1])
    assert torch.equal(g1["down_proj.weight"], expected_down)
    for k in ("gate_proj.weight", "up_proj.weight"):
        torch.testing.assert_close(g1[k], g0[k], rtol=2**-7, atol=1e-6)


def test_lean_layers_cover_every_norm_and_mlp_of_the_tiny_llama():
    from unifiedplayers.trainer.logprobs import lean_layers

    model, _ = tiny_model()
    with lean_layers(model):
        patched = [name for name, m in model.named_modules() if "forward" in m.__dict__]
    layers = model.config.num_hidden_layers
    assert len(patched) == 3 * layers + 1  # two norms and an MLP per layer, and the final norm
    assert not [name for name, m in model.named_modules() if "forward" in m.__dict__]
