"""``model.name`` follows ``model.path`` (``ModelConfig.name``'s default, :func:`unifiedplayers.config.backbone_name`)
unless set: the plan, the run's config and eval call a backbone by the directory or hub id it is loaded from, and the
plan reads that backbone's shapes from its config.json."""
from __future__ import annotations

import json

import pytest

from unifiedplayers.capacity import Hardware, UnknownArchitecture, model_arch, plan
from unifiedplayers.capacity.report import format_plan
from unifiedplayers.config import backbone_name, compose

SMALL = {"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000,
         "tie_word_embeddings": True, "max_position_embeddings": 8192}


@pytest.mark.parametrize("path,name", [
    ("Qwen/Qwen3-4B-Base", "Qwen3-4B-Base"),
    ("/models/Other", "Other"),
    ("/models/Other/", "Other"),
    ("~/models/./Other", "Other"),
    ("relative-dir", "relative-dir"),
    ("/cache/huggingface/hub/models--XiaomiMiMo--MiMo-7B-Base/snapshots/0123abcd", "MiMo-7B-Base"),
])
def test_the_backbone_is_named_after_its_path(path, name):
    assert backbone_name(path) == name


def test_no_path_and_no_name_is_an_error():
    with pytest.raises(ValueError, match="set model.name"):
        backbone_name(None)


def test_the_presets_names_and_an_override_of_the_path(tmp_path):
    assert compose(["experiment=paper_qwen3_4b"]).model.name == "Qwen3-4B-Base"
    assert compose(["experiment=paper_mimo_7b"]).model.name == "MiMo-7B-Base"
    assert compose(["experiment=smoke"]).model.name == "SmolLM2-135M-Instruct"  # no path: the preset names it
    assert compose(["experiment=tiny"]).model.name == "tiny-random-llama"
    other = tmp_path / "Other-7B"
    assert compose(["experiment=paper_qwen3_4b", f"model.path={other}"]).model.name == "Other-7B"
    # an explicit model.name wins, before or after the path
    assert compose(["experiment=paper_qwen3_4b", f"model.path={other}", "model.name=Mine"]).model.name == "Mine"
    assert compose(["experiment=paper_qwen3_4b", "model.name=Mine", f"model.path={other}"]).model.name == "Mine"


def test_evals_config_names_the_backbone_too(tmp_path):
    from eval.config import register_eval_configs

    register_eval_configs()
    cfg = compose(["model=qwen3_4b_base", f"model.path={tmp_path / 'Other'}"], config_name="evaluate")
    assert cfg.model.name == "Other"


def test_the_plan_reads_the_backbone_at_model_path(tmp_path):
    """A local model.path with a config.json: the plan's shapes are that backbone's, and so is its name; the paper's
    GPU-hours are not claimed for it."""
    other = tmp_path / "Small-Base"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(SMALL))
    p = plan(compose(["experiment=paper_qwen3_4b", f"model.path={other}"]), Hardware())
    assert p.model == "Small-Base" and p.arch.source == str(other / "config.json")
    assert p.arch.hidden_size == 256 and p.arch.num_hidden_layers == 4
    text = format_plan(p)
    assert text.startswith("Capacity plan: experiment=paper_qwen3_4b, Small-Base, N = ")
    assert "the paper gives no figure for Small-Base" in text
    named = plan(compose(["experiment=paper_qwen3_4b", f"model.path={other}", "model.name=Qwen3-4B-Base"]),
                 Hardware())
    assert named.model == "Qwen3-4B-Base" and named.arch == p.arch  # a name never overrides the shapes on disk


def test_a_backbone_the_plan_cannot_read_is_not_taken_for_the_presets():
    """A hub id (or a directory) not on this machine: its name looks up conf/model/arch/, which has no file for it,
    so the plan says so instead of planning Qwen3-4B-Base's shapes."""
    with pytest.raises(UnknownArchitecture, match="'Qwen3-8B-Base'.*conf/model/arch/qwen3_8b_base.json"):
        model_arch(compose(["experiment=paper_qwen3_4b", "model.path=Qwen/Qwen3-8B-Base"]).model)
    assert model_arch(compose(["experiment=paper_qwen3_4b", "model.path=/nowhere/Qwen3-4B-Base"]).model).source \
        == "conf/model/arch/qwen3_4b_base.json"
