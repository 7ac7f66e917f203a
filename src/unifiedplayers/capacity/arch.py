"""The backbone's shapes, read from its configuration only (never its weights): a local ``model.path``'s config.json,
a tiny_random model's own sizes, else ``conf/model/arch/<name>.json``."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from unifiedplayers.config import CONF_DIR

# The backbones' config.json figures, kept in the repository (the hub may be out of reach); "_source" says whence.
ARCH_DIR = CONF_DIR / "model" / "arch"


class UnknownArchitecture(ValueError):
    """The plan cannot tell the backbone's shapes."""


@dataclass(frozen=True)
class Arch:
    """The shapes of a decoder-only backbone (the fields of a transformers config.json)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool = False  # Qwen2-style q, k, v biases (MiMo)
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's queries and keys
    num_nextn_predict_layers: int = 0  # MiMo's multi-token-prediction layers: held and optimised, never run
    source: str = ""

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: attention (biases, q/k norms), the SwiGLU MLP and its two RMSNorms."""
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        attention = 2 * h * q + 2 * h * kv + (q + 2 * kv if self.attention_bias else 0)
        return attention + (2 * self.head_dim if self.qk_norm else 0) + 3 * h * self.intermediate_size + 2 * h

    @property
    def linear_parameters(self) -> int:
        """P_lin of :mod:`unifiedplayers.trainer.flops`: the decoder's linear weights, LM head excluded."""
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        return self.num_hidden_layers * (2 * h * q + 2 * h * kv + 3 * h * self.intermediate_size)

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def mtp_parameters(self) -> int:
        """MiMo's MTP layers: a decoder layer, the input projection (2h → h) and three more RMSNorms each."""
        h = self.hidden_size
        return self.num_nextn_predict_layers * (self.layer_parameters + 2 * h * h + 3 * h)

    @property
    def parameters(self) -> int:
        """N: the parameters the trainer holds (tied embeddings once, MTP layers included), the final norm too."""
        head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return (self.embedding_parameters + head + self.num_hidden_layers * self.layer_parameters
                + self.hidden_size + self.mtp_parameters)

    @property
    def sampled_parameters(self) -> int:
        """What vLLM loads: N without the MTP layers."""
        return self.parameters - self.mtp_parameters

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear projection of a decoder layer, by the name transformers gives it."""
        h, q, kv, i = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
                "up_proj": (h, i), "down_proj": (i, h)}

    def adapter_parameters(self, rank: int, targets: Any) -> int:
        """One LoRA adapter's parameters (``trainer.lora``): r (in + out) for each targeted projection of every decoder
        layer, MiMo's MTP layers included (their projections carry the same names)."""
        shapes = self.projection_shapes()
        unknown = sorted(set(targets) - set(shapes))
        if unknown:
            raise UnknownArchitecture(f"capacity: trainer.lora.target_modules {unknown} are not projections of a "
                                      f"decoder layer the plan knows ({', '.join(shapes)})")
        per_layer = sum(rank * sum(shapes[t]) for t in set(targets))
        return per_layer * (self.num_hidden_layers + self.num_nextn_predict_layers)

    def kv_bytes_per_token(self, width: int) -> int:
        """K and V of one position in every layer."""
        return 2 * self.num_hidden_layers * self.kv_width * width

    def layer_activations(self) -> int:
        """Values per token one decoder layer of transformers keeps for its backward: the layer's input, the two
        norms' inputs and outputs and the residual sum (6h), q, k, v and the attention output (2q + 2kv), and the MLP's
        gate, its activation, up and their product (4I). Measured: ``tests/capacity/test_layer_activations.py``."""
        return 6 * self.hidden_size + 2 * self.q_width + 2 * self.kv_width + 4 * self.intermediate_size

    def forward_flops(self, length: int, scored: int) -> float:
        """FLOPs of one row's forward (``trainer/flops.py``): ``length`` positions, the LM head on ``scored`` rows."""
        return self.extend_flops(0, length, scored)

    def extend_flops(self, start: int, new: int, scored: int) -> float:
        """FLOPs of ``new`` positions after a cached context of ``start`` (decoding, a turn's tool output)."""
        from unifiedplayers.trainer.flops import causal_pairs, head_forward_flops

        attention = 4 * self.q_width * self.num_hidden_layers * causal_pairs(start + new, start)
        return 2 * self.linear_parameters * new + attention + head_forward_flops(self.vocab_size, self.hidden_size,
                                                                                 scored)


def arch_from_config(config: Mapping[str, Any], source: str) -> Arch:
    """An :class:`Arch` from a config.json's fields. transformers' defaults where a field is absent: head_dim =
    hidden / heads, tied embeddings; QKV biases in Qwen2-type models (qwen2, mimo), q/k norms in Qwen3."""
    kind = str(config.get("model_type", ""))
    heads = int(config["num_attention_heads"])
    return Arch(
        hidden_size=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]), num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        vocab_size=int(config["vocab_size"]), tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        max_position_embeddings=int(config.get("max_position_embeddings") or 0),
        attention_bias=bool(config.get("attention_bias", kind in ("qwen2", "mimo"))), qk_norm=kind.startswith("qwen3"),
        num_nextn_predict_layers=int(config.get("num_nextn_predict_layers") or 0), source=source)


def arch_file(name: str) -> Path:
    """``conf/model/arch/<name>.json``, the name as its conf/model file spells it (Qwen3-4B-Base: qwen3_4b_base)."""
    return ARCH_DIR / (re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") + ".json")


def model_arch(model: Any) -> Arch:
    """The backbone's shapes: a tiny_random model's own sizes (the byte tokenizer's ids, untied, as
    ``models.build_tiny_random``), a local ``model.path``'s config.json, else :func:`arch_file` of ``model.name``."""
    if model.source == "tiny_random":
        from unifiedplayers.models import BYTE_SPECIAL_TOKENS

        keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings")
        if any(model.get(k) is None for k in keys):
            raise UnknownArchitecture("capacity: model.source=tiny_random without all of model."
                                      + ", model.".join(keys))
        h, i, layers, heads, kv, positions = (int(model.get(k)) for k in keys)
        return Arch(h, i, layers, heads, kv, h // heads, 256 + len(BYTE_SPECIAL_TOKENS), False, positions,
                    source="model.* sizes (tiny_random)")
    local = Path(os.path.expanduser(model.path)) / "config.json" if model.path else None
    if local is not None and local.is_file():
        return arch_from_config(json.loads(local.read_text()), str(local))
    path = arch_file(str(model.name))
    if not path.is_file():
        raise UnknownArchitecture(
            f"capacity: no architecture for model {model.name!r}: set model.path to a local directory holding its "
            f"config.json, or add {path.relative_to(CONF_DIR.parent)} with the fields of its config.json")
    return arch_from_config(json.loads(path.read_text()), str(path.relative_to(CONF_DIR.parent)))
