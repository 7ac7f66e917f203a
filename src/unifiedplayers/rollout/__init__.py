"""Rollouts: sampling completions with their behaviour log-probs (``conf/rollout/``).

This interface is a contract: the players, the evaluation harness and the trainer code against it,
and both backends (``hf``, ``vllm``) honour it exactly.

Build an engine and sample::

    from unifiedplayers.rollout import build_rollout, Completion, Segment, flatten_segments

    engine = build_rollout(cfg.rollout, model, tokenizer)      # backend "hf" (CPU default) or "vllm"
    outs = engine.generate(prompts, n=1, max_new_tokens=None, temperature=None, top_p=None,
                           stop=None, greedy=False, seed=None, ignore_eos=False)

``outs[i][j]`` is the ``j``-th :class:`Completion` of ``prompts[i]`` (the arguments:
:meth:`RolloutEngine.generate`; the fields, stop strings and eos: :class:`Completion`).
``logprobs[t]`` is the behaviour log-prob of ``token_ids[t]``, taken from the same forward pass that
sampled it and never recomputed: ``log_softmax(top_p_mask(logits / temperature))[token]``. With
``top_p = 1`` (the default) this is exactly ``log_softmax(logits / T)``, the quantity the trainer
recomputes for π_θ. With ``greedy=True`` the token is the argmax and its log-prob is
``log_softmax(logits)`` (temperature 1). Equal seeds give equal samples within a backend, not across.

Multi-turn contexts (the Execution player's tool loop)::

    ctx = [Segment.inserted(prompt_ids)]                      # never trainable
    c = engine.continue_segments([ctx], n=1, stop=["```\\n"])[0][0]
    ctx += [c.as_segment(), Segment.inserted(observation_ids)]
    token_ids, loss_mask, old_logprobs = flatten_segments(ctx)

``continue_segments`` takes the same arguments as ``generate`` with a list of segment lists in place
of prompts (:class:`Segment`, :func:`flatten_segments`).

After each optimizer step that changes the behaviour policy, ``engine.update_weights(model)``
(:meth:`RolloutEngine.update_weights`; each backend says what it does).

A new backend is one module and one ``conf/rollout/<name>.yaml``: a :class:`RolloutEngine` subclass registered with
``@register_rollout_engine("<name>")`` (or, outside the package, named by ``_target_: my_module.MyEngine`` in its
YAML), with its pre-load :meth:`~RolloutEngine.check` and :attr:`~RolloutEngine.samples_from_module`.

Both backends are tested against the same contract: ``tests/rollout/test_rollout.py`` (hf, tiny Llama, in
``make test``) and ``tests/rollout/test_rollout_vllm.py`` (vllm, ``make test-vllm`` with the CPU wheel), each
checking the behaviour log-probs against a separate teacher-forced forward pass.
"""
from __future__ import annotations

from typing import Any

from unifiedplayers.config import RolloutConfig
from unifiedplayers.registry import import_object
from unifiedplayers.rollout.base import ROLLOUT_ENGINES, RolloutEngine, register_rollout_engine
from unifiedplayers.rollout.types import Completion, Segment, find_stop, flatten_segments

__all__ = ["build_rollout", "check_backend", "engine_class", "register_rollout_engine", "RolloutEngine", "Completion",
           "Segment", "flatten_segments", "find_stop", "ROLLOUT_ENGINES"]

# The built-in backends, imported when a run names them (each module registers its class under the same name).
ROLLOUT_ENGINES.register("hf", "unifiedplayers.rollout.hf_engine:HFRollout")
ROLLOUT_ENGINES.register("vllm", "unifiedplayers.rollout.vllm_engine:VLLMRollout")


def engine_class(cfg: RolloutConfig) -> Any:
    """The engine class (or factory) of ``cfg``: its ``_target_`` when set (an engine outside the package, named by
    its YAML), else the one registered as ``cfg.backend``. Imports the engine's module, never vLLM itself."""
    target = getattr(cfg, "_target_", None)
    if not target:
        return ROLLOUT_ENGINES.get(cfg.backend)
    try:
        return import_object(str(target))
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"rollout._target_={target!r} cannot be imported ({e}); is its folder on PYTHONPATH?") from None


def check_backend(cfg: RolloutConfig) -> None:
    """Refuse, before any model is loaded, a backend this environment cannot run as tested: the engine's own
    :meth:`~RolloutEngine.check` (``vllm``: not installed, or a version outside
    :data:`~unifiedplayers.rollout.vllm_engine.VLLM_WINDOW`, read from package metadata: vLLM is not imported)."""
    check = getattr(engine_class(cfg), "check", None)
    if check is not None:
        check(cfg)


def build_rollout(cfg: RolloutConfig, model: Any, tokenizer: Any) -> RolloutEngine:
    """The rollout engine named by ``cfg`` (``_target_`` or ``backend``) over ``model`` and ``tokenizer``."""
    return engine_class(cfg)(cfg, model, tokenizer)
