"""Token log-probs of the trainer: only the selected rows reach the LM head, chunked or not."""
from __future__ import annotations

import pytest
import torch

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
