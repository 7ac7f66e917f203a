"""The hf engine's shared-prefix KV cache (rollout.prefix_cache) against whole-prompt prefills, on the tiny random
Llama in float32."""
from __future__ import annotations

import copy
import os

import pytest
import torch

from unifiedplayers.config import ModelConfig, RolloutConfig
from unifiedplayers.models import load_model
from unifiedplayers.rollout import Segment, build_rollout
from unifiedplayers.rollout import hf_engine
from unifiedplayers.rollout.prefix_cache import MIN_PREFIX, common_prefix_length, prefix_setting

os.environ.setdefault("HF_HUB_OFFLINE", "1")

@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny():
    return load_model(ModelConfig(name="tiny", source="tiny_random", dtype="float32", device="cpu", seed=0))


def ids_of(outs):
    return [[c.token_ids for c in row] for row in outs]


def assert_same(a, b, atol=1e-5):
    """Equal tokens, finish reasons and texts; log-probs equal up to float rounding."""
    assert ids_of(a) == ids_of(b)
    for row_a, row_b in zip(a, b):
        for x, y in zip(row_a, row_b):
            assert (x.finish_reason, x.stop_str, x.text) == (y.finish_reason, y.stop_str, y.text)
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol, rtol=0)


def shared_prompts(tok) -> list[list[int]]:
    """Prompts sharing a long few-shot prefix, with own parts of different lengths (one of a single token)."""
    shots = tok("Q: what is 2+3? A: 5. Q: what is 7*6? A: 42. Q: and 10-4? A: 6. ", add_special_tokens=False)["input_ids"]
    prefix = shots * 2
    assert len(prefix) >= 2 * MIN_PREFIX
    own = ["Q: 9+9?", "Q: what is the square of eleven, please? A:", "Q: 1?", "?"]
    return [prefix + tok(s, add_special_tokens=False)["input_ids"] for s in own]


def engines(model, tok, **cfg):
    return (build_rollout(RolloutConfig(prefix_cache="true", **cfg), model, tok),
            build_rollout(RolloutConfig(prefix_cache="false", **cfg), model, tok))


def forward_shapes(model):
    """The input shapes of the model's forward calls, while the returned list is being filled."""
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    return shapes, hook


def test_prefix_cache_gives_the_outputs_of_whole_prompt_prefills(tiny):
    model, tok = tiny
    cached, plain = engines(model, tok, batch_size=0)
    prompts = shared_prompts(tok)
    prefix_len = common_prefix_length(prompts)
    shapes, hook = forward_shapes(model)
    try:
        first = cached.generate(prompts, n=3, max_new_tokens=12, greedy=True)
    finally:
        hook.remove()
    # The prefix once (one row), then the four prompts' own parts on top of it, then 12 rows a step.
    assert shapes[0] == (1, prefix_len) and shapes[1] == (4, max(map(len, prompts)) - prefix_len)
    assert shapes[2] == (12, 1)
    assert_same(first, plain.generate(prompts, n=3, max_new_tokens=12, greedy=True))

    # A second call with other samples reuses the stored prefix: no prefill of it, the same outputs as without.
    hits = cached._prefixes.hits
    kw = dict(n=2, max_new_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    shapes, hook = forward_shapes(model)
    try:
        second = cached.generate(prompts[::-1], **kw)
    finally:
        hook.remove()
    assert cached._prefixes.hits == hits + prefix_len and shapes[0][0] == 4
    assert_same(second, plain.generate(prompts[::-1], **kw))


def test_prefix_cache_serves_the_next_turn_of_a_transcript(tiny):
    model, tok = tiny
    cached, plain = engines(model, tok)
    ctx = [Segment.inserted(shared_prompts(tok)[1])]
    for turn in range(3):
        kw = dict(n=2, max_new_tokens=8, temperature=1.0, seed=turn, ignore_eos=True)
        hits = cached._prefixes.hits
        a, b = cached.continue_segments([ctx], **kw), plain.continue_segments([ctx], **kw)
        assert_same(a, b)
        if turn:  # everything but the last token of the previous turn's prompt came from the store
            assert cached._prefixes.hits - hits == previous
        previous = len(a[0][0].prompt_ids) - 1
        ctx = ctx + [a[0][0].as_segment(), Segment.inserted(tok(" ok.", add_special_tokens=False)["input_ids"])]


def test_prefix_cache_is_not_reused_after_the_weights_change(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    cached, plain = engines(model, tok)
    prompts = shared_prompts(tok)[:2]
    kw = dict(n=1, max_new_tokens=6, greedy=True)
    cached.generate(prompts, **kw)
    weight = model.model.layers[0].self_attn.k_proj.weight
    for change in (lambda: weight.mul_(1.5), lambda: weight.data.mul_(0.5)):  # in place; through .data, unversioned
        hits = cached._prefixes.hits
        with torch.no_grad():
            change()
        assert_same(cached.generate(prompts, **kw), plain.generate(prompts, **kw))
        assert cached._prefixes.hits == hits  # the stored prefix of the old weights was dropped
    cached.generate(prompts, **kw)
    assert cached._prefixes.hits > hits  # unchanged weights: reused


def test_prefix_cache_setting(tiny):
    model, tok = tiny
    assert [prefix_setting(v) for v in ("auto", "true", "false", True, False, "True")] == [None, True, False, True, False, True]
    with pytest.raises(ValueError, match="prefix_cache"):
        prefix_setting("sometimes")
    auto = build_rollout(RolloutConfig(), model, tok)
    assert not auto.prefix_cache_on()  # float32: the whole-prompt prefill, bit for bit
    shapes, hook = forward_shapes(model)
    try:
        auto.generate(shared_prompts(tok), max_new_tokens=2, greedy=True)
    finally:
        hook.remove()
    assert shapes[0][0] == 4 and not auto._prefixes.entries
    half = build_rollout(RolloutConfig(), copy.deepcopy(model).to(torch.bfloat16), tok)
    assert half.prefix_cache_on()
    assert not build_rollout(RolloutConfig(prefix_cache=False), half.model, tok).prefix_cache_on()


def test_evaluation_turns_auto_into_true_and_keeps_an_explicit_setting():
    from omegaconf import OmegaConf

    from unifiedplayers.rollout.prefix_cache import for_evaluation

    auto = RolloutConfig()
    assert for_evaluation(auto).prefix_cache == "true" and auto.prefix_cache == "auto"  # a copy
    off = RolloutConfig(prefix_cache="false")
    assert for_evaluation(off) is off
    yaml = OmegaConf.create({"backend": "hf", "batch_size": 8})  # a run's config.yaml from before the setting
    OmegaConf.set_struct(yaml, True)
    assert for_evaluation(yaml).prefix_cache == "true" and "prefix_cache" not in yaml
    typed = OmegaConf.structured(RolloutConfig(prefix_cache=False))  # Hydra's bool, kept as the str "False"
    assert for_evaluation(typed) is typed


def test_a_new_checkpoint_name_drops_the_stored_prefixes():
    """The loop's engines tell an hf engine when the weights it samples changed (a new checkpoint name for the
    same module), so no stored prefix KV outlives them even where a backend writes weights without bumping the
    parameters' version counters."""
    from types import SimpleNamespace

    from unifiedplayers.loop.engines import RolloutEngines

    class Engine:
        forgotten = 0

        def forget_prefixes(self):
            self.forgotten += 1

    engines = RolloutEngines(SimpleNamespace(backend="hf"), tokenizer=None, build=lambda cfg, model, tok: Engine())
    model = object()
    first = engines.engine(model, ("execution", 1, 0, False))
    assert engines.engine(model, ("execution", 1, 0, False)) is first and first.forgotten == 1
    engines.engine(model, ("execution", 1, 1, False))
    assert first.forgotten == 2
    second = engines.engine(object(), ("planning", 1, 0, False))
    assert engines.built() == [first, second]  # one per module


def test_a_backend_that_swaps_weights_builds_one_engine():
    """vLLM's kind of engine: one, built inside the trainer's ``gather`` and updated (inside it too) when another
    player's weights sample; asking for the loaded weights again swaps nothing."""
    import contextlib
    from types import SimpleNamespace

    from unifiedplayers.loop.engines import RolloutEngines

    gathers, updates = [], []

    class Engine:
        def update_weights(self, model):
            updates.append(model)

    @contextlib.contextmanager
    def gather():
        gathers.append(1)
        yield

    engines = RolloutEngines(SimpleNamespace(backend="vllm"), tokenizer=None, build=lambda cfg, model, tok: Engine())
    a, b = object(), object()
    shared = engines.engine(a, "a", gather)
    assert engines.engine(a, "a", gather) is shared and (len(gathers), updates) == (1, [])
    assert engines.engine(b, "b", gather) is shared and (len(gathers), updates) == (2, [b])
    assert engines.built() == [shared]


@pytest.mark.parametrize("diverges", [False, True], ids=["strict-prefix-of-stored", "diverges-from-stored"])
def test_prefix_cache_on_a_partial_match_of_a_stored_prefix_equals_the_plain_engine(tiny, diverges):
    """A first call stores the KV of a long shared prefix; the second call's prompts share only its first
    ``cut`` tokens (then their own parts, or first a common part that differs from the stored prefix): the
    store must hand back those ``cut`` positions only.

    Catches the plant "``PrefixStore.lookup`` returns the whole stored entry instead of the matched part": the
    second call's cache would hold the stored prefix's later positions too (outputs differ, or the cache
    cannot take its rows' length)."""
    model, tok = tiny
    cached, plain = engines(model, tok, batch_size=0)
    first = shared_prompts(tok)
    stored = first[0][: common_prefix_length(first)]
    cached.generate(first, n=1, max_new_tokens=2, greedy=True)
    assert list(cached._prefixes.entries) == [tuple(stored)]

    cut = MIN_PREFIX + 8
    assert len(stored) > cut + 8
    middle = tok("# something else entirely:", add_special_tokens=False)["input_ids"] if diverges else []
    assert not middle or middle[0] != stored[cut]
    own = ["Q: 9+9?", "Q: what is the square of eleven, please? A:", "?"]
    prompts = [stored[:cut] + middle + tok(s, add_special_tokens=False)["input_ids"] for s in own]
    assert common_prefix_length(prompts) == cut + len(middle) >= MIN_PREFIX

    hits = cached._prefixes.hits
    kw = dict(n=1, max_new_tokens=10, greedy=True)
    assert_same(cached.generate(prompts, **kw), plain.generate(prompts, **kw))
    assert cached._prefixes.hits == hits + cut  # the store served the matched part, no more
    kw = dict(n=2, max_new_tokens=10, temperature=1.0, seed=4)  # served again (whole, where the first call stored it)
    assert_same(cached.generate(prompts, **kw), plain.generate(prompts, **kw))
