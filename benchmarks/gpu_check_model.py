"""The GPU check's model and inputs: a ``Qwen3ForCausalLM`` of Qwen3-4B-Base's architecture (``--shape qwen3_4b``),
of Qwen3-1.7B-Base's (``--shape qwen3_1_7b``, the backbone of ``experiment=one_gpu``) or a 2-layer toy of the 4B
(``--shape tiny``) with random weights, and each player's short prompts.

Qwen3-4B-Base's architecture, from the ``config.json`` of the Hugging Face repository Qwen/Qwen3-4B-Base
(the Qwen3-4B card: 4.0B parameters, 3.6B without embeddings, 36 layers, 32 query / 8 key-value heads,
32,768 context): hidden 2560, intermediate 9728, 36 layers, 32 heads, 8 kv heads, head_dim 128 (so the
query projection is 4096 wide, not 2560), vocab 151,936, rope_theta 1e6, max_position_embeddings 32,768,
tied embeddings, rms_norm_eps 1e-6, no attention bias: 4,022,468,096 parameters.

Qwen3-1.7B-Base's figures are read from conf/model/arch/qwen3_1_7b_base.json, the file the capacity plan reads (hidden
2048, intermediate 6144, 28 layers, 16 heads, 8 kv heads, head_dim 128, the same vocabulary, tied embeddings:
1,720,574,976 parameters); rope_theta, rms_norm_eps and the activation, which that file does not hold, are the 4B's
(the two config.json files agree on them).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

PLAYERS = ("planning", "execution", "evaluation")

# Qwen/Qwen3-4B-Base config.json (see the module docstring); bos/eos/pad are set to the byte tokenizer's.
QWEN3_4B = dict(
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    rope_theta=1_000_000.0,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    attention_bias=False,
    hidden_act="silu",
)
ARCH_DIR = Path(__file__).resolve().parents[1] / "conf" / "model" / "arch"


def arch_shape(name: str) -> dict:
    """The 4B's fields with those that ``conf/model/arch/<name>.json`` holds (a config.json's figures) put in."""
    fields = json.loads((ARCH_DIR / f"{name}.json").read_text())
    return dict(QWEN3_4B, **{k: fields[k] for k in QWEN3_4B if k in fields})


# Qwen/Qwen3-1.7B-Base, experiment=one_gpu's backbone (see the module docstring).
QWEN3_1_7B = arch_shape("qwen3_1_7b_base")
# Same structure (GQA, q/k norms, tied head), 2 layers, the byte tokenizer's vocabulary: every id decodes.
TINY = dict(QWEN3_4B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=259)
SHAPES = {"qwen3_4b": QWEN3_4B, "qwen3_1_7b": QWEN3_1_7B, "tiny": TINY}
# What each shape runs by default: (prompts, samples per prompt, new tokens, micro-batch size).
SHAPE_DEFAULTS = {"qwen3_4b": (4, 4, 128, 2), "qwen3_1_7b": (4, 4, 128, 2), "tiny": (4, 4, 24, 4)}

# Our own short prompts, a system line and four tasks per player (115-131 byte tokens each, rendered).
PROMPTS = {
    "planning": ("You write short math word problems with one numeric answer.",
                 ["Write a problem about trains.", "Write a problem about apples.",
                  "Write a problem about savings.", "Write a problem about areas."]),
    "execution": ("Solve it with a ```python block that prints the answer.",
                  ["A pen costs 3. What do 7 pens cost?", "What is 17 * 23 - 5?",
                   "A car drives 60 km/h for 3 h. How far?", "How many days are in 5 weeks?"]),
    "evaluation": ("Write def check(answer) that returns True if the answer is right.",
                   ["Question: 7 pens at 3 each. Answer: 21", "Question: 17 * 23 - 5. Answer: 386",
                    "Question: 60 km/h for 3 h. Answer: 180", "Question: days in 5 weeks. Answer: 35"]),
}

def qwen3_config(shape: str, num_layers: Optional[int] = None, tokenizer: Any = None):
    """A transformers ``Qwen3Config`` of ``shape`` (optionally cut to ``num_layers``)."""
    from transformers import Qwen3Config

    values = dict(SHAPES[shape])
    if num_layers:
        values["num_hidden_layers"] = num_layers
    ids = {}
    if tokenizer is not None:
        ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    return Qwen3Config(**values, **ids)


def count_parameters(config) -> int:
    """Parameters of a ``Qwen3ForCausalLM`` of ``config``, built on the meta device (nothing allocated)."""
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def build_model(config, device, seed: int):
    """A float32 ``Qwen3ForCausalLM`` with random weights, allocated and initialised on ``device``."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.float().eval()


def sampling_module(trainer, dtype):
    """The module the hf engine samples from: ``trainer.rollout_model`` where the trainer has one, else its
    ``sampling_model(dtype)``, else ``trainer.model``."""
    module = getattr(trainer, "rollout_model", None)
    if module is not None:
        return module
    if callable(getattr(trainer, "sampling_model", None)):
        return trainer.sampling_model(dtype)
    return trainer.model


def render_prompts(tokenizer, role: str, count: int) -> list[str]:
    system, tasks = PROMPTS[role]
    return [tokenizer.apply_chat_template([{"role": "system", "content": system},
                                           {"role": "user", "content": tasks[i % len(tasks)]}],
                                          add_generation_prompt=True, tokenize=False) for i in range(count)]


def parameters_label(n: int) -> str:
    """A parameter count as the check prints it: 4.022B, 0.590B, 1.234M."""
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"
