"""``python -m unifiedplayers.export`` on a run of adapter players (``trainer.lora.rank`` > 0): ``--format merged``
writes the backbone with the adapter folded in, which computes what the trained player computes; ``--format
adapter`` writes PEFT's format, which ``PeftModel.from_pretrained`` loads onto the backbone beside it and which then
gives the merged export's greedy tokens. A run that trained every parameter has no adapter to export."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.loop import toy_reward
from unifiedplayers.config import compose
from unifiedplayers.export import ExportError, export_run, main
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers import lora

pytestmark = pytest.mark.cpu

PROMPT = [[5, 17, 42, 9, 33, 61]]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_export")
    with pytest.MonkeyPatch.context() as mp:
        toy_reward.install(mp)
        loop = OuterLoop(compose(["experiment=tiny", "trainer.lora.rank=4", "trainer.lr=1e-1"]), d)
        loop.run()
    return d, loop


def greedy(model, n: int = 8) -> list[int]:
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_merged_and_adapter_exports_compute_the_trained_player(lora_run, tmp_path):
    from peft import PeftModel

    d, loop = lora_run
    player = loop.players["execution"].model
    assert any(t.abs().sum() > 0 for n, t in lora.adapter_state(player).items() if "lora_B" in n)
    merged_dir, = export_run(d, "execution", tmp_path / "merged", dtype="float32")
    adapter_dir, = export_run(d, "execution", tmp_path / "adapter", dtype="float32", fmt="adapter")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = player(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(adapter_dir / "base")
    assert json.loads((adapter_dir / "unifiedplayers_export.json").read_text())["format"] == "adapter"
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    peft = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(peft(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
    assert greedy(peft) == greedy(merged)
    assert AutoTokenizer.from_pretrained(adapter_dir) is not None


def test_an_adapter_export_of_a_full_parameter_run_is_refused(tmp_path):
    OuterLoop(compose(["experiment=tiny"]), tmp_path / "run").run()
    with pytest.raises(ExportError, match="trained every parameter"):
        export_run(tmp_path / "run", "execution", tmp_path / "out", fmt="adapter")
    with pytest.raises(SystemExit, match="trained every parameter"):
        main([str(tmp_path / "run"), "--format", "adapter", "--out", str(tmp_path / "out2")])


def test_the_checkpoint_readers_fold_the_adapter_into_the_backbone(lora_run):
    """eval/ and the probes read a trainer checkpoint's model.pt: an adapter run's is folded into the backbone, with
    the rank, alpha and targets of the adapter_config.json the trainer writes beside it."""
    from unifiedplayers.models import load_model

    d, loop = lora_run
    ckpt = d / "checkpoints" / "iter1" / "execution"
    assert (ckpt / "adapter_config.json").is_file()
    backbone, _ = load_model(compose(["experiment=tiny"]).model)
    state = lora.checkpoint_weights(backbone, str(ckpt / "model.pt"))
    assert not any("lora_" in k or "base_layer" in k for k in state)
    plain, _ = load_model(compose(["experiment=tiny"]).model)
    plain.load_state_dict(state)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, loop.players["execution"].model(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-4)
    (ckpt / "adapter_config.json").unlink()
    with pytest.raises(ValueError, match="no adapter_config.json"):
        lora.checkpoint_weights(backbone, str(ckpt / "model.pt"))
