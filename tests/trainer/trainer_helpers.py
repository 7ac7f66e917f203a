"""Shared pieces of the trainer tests: the tiny random Llama and synthetic GRPO batches."""
from __future__ import annotations

import copy
import functools

import torch

from unifiedplayers.trainer import grpo
from unifiedplayers.config import ModelConfig, TrainerConfig
from unifiedplayers.models import load_model
from unifiedplayers.trainer import TrainSample, selected_token_logprobs

TINY = dict(
    name="tiny-random-llama-test",
    source="tiny_random",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    dtype="float32",
    device="cpu",
    seed=0,
)


@functools.lru_cache(maxsize=None)
def _tiny_model_cached(seed: int):
    return load_model(ModelConfig(**{**TINY, "seed": seed}))


def tiny_model(seed: int = 0):
    """A fresh copy of the ``tiny_random`` preset at test size (same seed, same weights)."""
    model, tokenizer = _tiny_model_cached(seed)
    return copy.deepcopy(model), tokenizer


def trainer_config(**overrides) -> TrainerConfig:
    base = dict(lr=1e-3, micro_batch_size=3, kl_coef=0.05, entropy_every=0, dtype="float32", logprob_chunk_rows=0)
    base.update(overrides)
    return TrainerConfig(**base)


def synthetic_batch(model, generator: torch.Generator, n: int = 8, group_size: int = 4, prompt_len: int = 3):
    """``n`` samples in groups of ``group_size``: random tokens, a masked prompt and a masked 'tool
    observation' in the middle, behaviour log-probs = the model's own plus noise (ratios near 1)."""
    vocab = model.config.vocab_size
    samples = []
    rewards = torch.rand(n, generator=generator)
    groups = torch.arange(n) // group_size
    adv = grpo.group_advantages(rewards, groups)
    for i in range(n):
        length = prompt_len + 4 + int(torch.randint(0, 6, (1,), generator=generator))
        ids = torch.randint(3, vocab, (length,), generator=generator)
        mask = torch.zeros(length, dtype=torch.long)
        mask[prompt_len:] = 1
        mask[prompt_len + 2] = 0  # an inserted observation token inside the completion
        with torch.no_grad():
            own = selected_token_logprobs(model, ids[None], torch.ones(1, length, dtype=torch.long),
                                          mask[None].bool()).logprobs[0]
        old = (own + 0.1 * torch.randn(length, generator=generator)) * mask
        samples.append(TrainSample(ids.tolist(), mask.tolist(), old.tolist(), float(adv[i]), int(groups[i])))
    return samples


def torch_reference_run(batches, steps: int):
    """The torch backend from the tiny model's start over ``batches[:steps]``, on one thread: per-step metrics and
    the final weights (what the DeepSpeed tests compare their steps with)."""
    from unifiedplayers.trainer import build_trainer

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(kl_coef=0.05), model)
    trainer.start_outer_iteration()
    metrics = [trainer.update(b) for b in batches[:steps]]
    torch.set_num_threads(before)
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_equals_torch_run(trainer, metrics, torch_run) -> None:
    """A DeepSpeed trainer's per-step ``metrics`` and weights equal ``torch_run`` (:func:`torch_reference_run`): loss
    to 1e-6, grad-norm to rel 1e-5, weights to 1e-5 (ZeRO's reduction order)."""
    import pytest

    torch_metrics, torch_params = torch_run
    for a, b in zip(torch_metrics, metrics):
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=1e-6)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-5)
    params = trainer.full_state_dict()
    for k, v in torch_params.items():
        torch.testing.assert_close(params[k], v, atol=1e-5, rtol=0)
