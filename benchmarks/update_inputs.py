"""The GRPO update benchmarks' inputs, shared by ``grpo_update.py``, ``precision_floors.py`` and ``threads.py``:
SmolLM2-135M-Instruct loaded with float32 weights, and its one chat prompt of 49 tokens."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# 49 prompt tokens with SmolLM2's chat template, so that a row is 49 + 256 = 305 tokens as in the update targets'
# figures (without a system message the template adds a 41-token default one).
SYSTEM = "Reason step by step."
QUESTION = "A train leaves at 3 pm and travels 240 km at 80 km/h. At what time does it arrive there?"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def model_cfg():
    """The preset's model, loaded in float32 whatever its ``dtype`` says: the torch trainer's master weights are
    float32 (as ``Team`` loads them for a trained player), and each configuration casts its own copies."""
    from omegaconf import OmegaConf

    from unifiedplayers.config import ModelConfig

    yaml = OmegaConf.load(ROOT / "conf" / "model" / "smollm2_135m_instruct.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml, {"dtype": "float32"}))


def load_fp32_model():
    """(model, tokenizer) of the benchmark, float32 weights."""
    from unifiedplayers.models import load_model

    return load_model(model_cfg())


def prompt_ids(tokenizer) -> list[int]:
    """The benchmark's prompt (:data:`MESSAGES` in the chat template), as token ids."""
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]
