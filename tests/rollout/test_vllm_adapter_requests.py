"""The requests through which vLLM serves adapter players (``trainer.lora.rank`` > 0), in the main suite with vLLM's
``LoRARequest`` faked: vLLM keeps a loaded adapter by its integer id and never reads that id's folder again, so each
version of a player that the engine is given must be a new id, whose folder holds that version's adapter
(``make test-vllm``'s tests/rollout/test_vllm_lora.py runs the real engine)."""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.test_lora import players
from unifiedplayers import lora
from unifiedplayers.rollout.vllm_engine import MAX_LORAS, VLLMRollout

pytestmark = pytest.mark.cpu


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


def test_each_version_of_an_adapter_player_is_a_new_lora_request_holding_that_version(monkeypatch):
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    for name, module in (("vllm", types.ModuleType("vllm")), ("vllm.lora", types.ModuleType("vllm.lora")),
                         ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    _, two, _ = players(2)
    engine = VLLMRollout.__new__(VLLMRollout)  # the engine's adapter bookkeeping alone, no vLLM engine behind it
    engine._adapters, engine._lora, engine._lora_dirs = True, None, []
    sent = []
    for version in range(3):
        for player in two:
            with torch.no_grad():  # a new version of this player
                for n, p in player.named_parameters():
                    if "lora_B" in n:
                        p.add_(0.01 * (version + 1))
            engine.update_weights(player)
            sent.append((engine._lora, lora.peft_format(player)))
    ids = [r.lora_int_id for r, _ in sent]
    assert len(set(ids)) == len(ids) and len({r.lora_name for r, _ in sent}) == len(sent)
    assert len({r.lora_path for r, _ in sent}) == len(sent)
    for req, want in sent[-MAX_LORAS:]:  # the adapters vLLM may still load: each folder holds its version
        got = load_file(str(Path(req.lora_path) / "adapter_model.safetensors"))
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), req
