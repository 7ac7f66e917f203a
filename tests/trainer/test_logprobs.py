"""Token log-probs of the trainer: only the selected rows reach the LM head, chunked or not."""
from __future__ import annotations

import pytest
import torch

from unifiedplayers.trainer import build_trainer, selected_token_logprobs

from trainer_helpers import synthetic_batch, tiny_model, trainer_config

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
