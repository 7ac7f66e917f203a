"""unifiedplayers.rollout with the hf backend on a real tiny Llama: behaviour log-probs against a
separate teacher-forced pass, greedy decoding, seeds, stop strings, eos, segments, errors."""
from __future__ import annotations

import copy
import os

import pytest
import torch

from unifiedplayers.config import ModelConfig, RolloutConfig
from unifiedplayers.models import load_model
from unifiedplayers.rollout import Completion, Segment, build_rollout, find_stop, flatten_segments
from unifiedplayers.rollout.hf_engine import draw, top_p_mask

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """A tiny model runs fastest on one thread, and far faster than two on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny():
    return load_model(ModelConfig(name="tiny", source="tiny_random", dtype="float32", device="cpu", seed=0))


@pytest.fixture(scope="module")
def engine(tiny):
    model, tok = tiny
    return build_rollout(RolloutConfig(backend="hf", batch_size=4), model, tok)


def chat(tok, text: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def teacher_forced(model, prompt_ids, token_ids, temperature=1.0):
    """log_softmax(logits / T) at each completion position, and the argmax, from one plain forward pass."""
    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    picked = logp.gather(-1, torch.tensor(token_ids)[:, None]).squeeze(-1)
    return picked, logits.argmax(-1)


# ----------------------------------------------------------------------------- behaviour log-probs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_a_teacher_forced_pass(tiny, engine, temperature):
    model, tok = tiny
    # Prompts of different lengths share batches (left padding), and n > 1.
    prompts = [chat(tok, "hi"), chat(tok, "a much longer question about numbers"), "x"]
    outs = engine.generate(prompts, n=3, max_new_tokens=24, temperature=temperature, seed=0, ignore_eos=True)
    assert [len(o) for o in outs] == [3, 3, 3]
    for p, row in zip(prompts, outs):
        for c in row:
            assert c.prompt_ids == tok(p, add_special_tokens=False)["input_ids"]
            assert len(c.token_ids) == len(c.logprobs) == 24 and c.finish_reason == "length"
            ref, _ = teacher_forced(model, c.prompt_ids, c.token_ids, temperature)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4), (c.logprobs[:4], ref[:4])


def test_greedy_is_the_argmax_of_the_teacher_forced_pass(tiny, engine):
    model, tok = tiny
    outs = engine.generate([chat(tok, "hello"), "abc"], n=2, max_new_tokens=20, greedy=True, temperature=0.3)
    for row in outs:
        assert row[0].token_ids == row[1].token_ids  # greedy ignores the seed and the sample index
        c = row[0]
        ref, argmax = teacher_forced(model, c.prompt_ids, c.token_ids, temperature=1.0)  # greedy: T ignored
        n_eos_free = len(c.token_ids)
        assert c.token_ids == argmax[:n_eos_free].tolist()
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_rows_do_not_depend_on_their_batch_mates(tiny):
    model, tok = tiny
    prompts = [chat(tok, "short"), chat(tok, "a rather longer prompt than the first"), "z"]
    alone = build_rollout(RolloutConfig(batch_size=1), model, tok).generate(prompts, max_new_tokens=16, greedy=True)
    together = build_rollout(RolloutConfig(batch_size=0), model, tok).generate(prompts, max_new_tokens=16, greedy=True)
    for a, b in zip(alone, together):
        assert a[0].token_ids == b[0].token_ids
        assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-5)


def test_one_prefill_per_distinct_prompt_and_one_row_per_sample(tiny):
    model, tok = tiny
    engine = build_rollout(RolloutConfig(batch_size=0), model, tok)
    prompts = [chat(tok, "one"), chat(tok, "a second, longer prompt")]
    shapes = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        outs = engine.generate(prompts, n=4, max_new_tokens=3, ignore_eos=True, seed=0)
    finally:
        hook.remove()
    assert shapes[0][0] == 2 and shapes[1:] == [(8, 1), (8, 1)]  # prefill of the 2 prompts, then 8 rows
    for p, row in zip(prompts, outs):  # each sample continues its own prompt
        for c in row:
            ref, _ = teacher_forced(model, c.prompt_ids, c.token_ids)
            assert c.prompt_ids == tok(p, add_special_tokens=False)["input_ids"]
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_preallocated_cache_layer_grows_and_equals_concatenation():
    from unifiedplayers.rollout.hf_engine import PreallocatedLayer

    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 5, 4, generator=g), torch.randn(2, 3, 5, 4, generator=g)
    layer = PreallocatedLayer(keys, values, limit=12, room=2)
    for n in (1, 1, 3, 2):  # grows from 7 positions to 12
        k, v = torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g)
        out_k, out_v = layer.update(k, v)
        keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        assert torch.equal(out_k, keys) and torch.equal(out_v, values) and layer.get_seq_length() == keys.shape[2]
    with pytest.raises(RuntimeError, match="limited to 12"):
        layer.update(k, v)


def test_a_seed_reproduces_a_call_and_another_seed_does_not(tiny, engine):
    _, tok = tiny
    prompts = [chat(tok, "seed test"), "another"]
    kw = dict(n=4, max_new_tokens=16, temperature=1.0, ignore_eos=True)
    a = engine.generate(prompts, seed=7, **kw)
    b = engine.generate(prompts, seed=7, **kw)
    c = engine.generate(prompts, seed=8, **kw)
    ids = lambda outs: [[x.token_ids for x in row] for row in outs]  # noqa: E731
    assert ids(a) == ids(b)
    assert [[x.logprobs for x in row] for row in a] == [[x.logprobs for x in row] for row in b]
    assert ids(a) != ids(c)
    assert len({tuple(t) for t in ids(a)[0]}) == 4  # the n samples of one prompt differ


def test_top_p_mask_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]))
    kept = torch.isfinite(top_p_mask(logits, 0.8))
    # mass before each token (sorted): 0, .5, .8, .95 -> the nucleus of 0.8 is the two most likely.
    assert kept.tolist() == [[True, True, False, False], [False, False, True, True]]
    assert torch.isfinite(top_p_mask(logits, 0.01)).sum(-1).tolist() == [1, 1]  # the top token always stays
    assert torch.equal(top_p_mask(logits, 1.0), logits)


def test_draw_follows_the_distribution_and_never_picks_a_zero():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 0.0, 1.0]]).repeat(50_000, 1)
    tokens = draw(probs, torch.Generator().manual_seed(0)).view(-1, 2)
    freq = torch.bincount(tokens[:, 0], minlength=4).float() / tokens.shape[0]
    assert freq[1] == 0 and torch.allclose(freq, torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.01)
    assert (tokens[:, 1] == 3).all()


def test_top_p_logprobs_are_of_the_renormalised_nucleus(tiny, engine):
    model, tok = tiny
    c = engine.generate([chat(tok, "nucleus")], n=1, max_new_tokens=12, temperature=0.5, top_p=0.3, seed=1, ignore_eos=True)[0][0]
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(top_p_mask(logits / 0.5, 0.3), dim=-1)
    picked = logp.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
    assert torch.isfinite(picked).all()  # every sampled token lies in its nucleus
    assert torch.allclose(torch.tensor(c.logprobs), picked, atol=1e-4)


# ----------------------------------------------------------------------------- stop strings and eos


def test_find_stop_by_hand():
    assert find_stop("abc```\nxyz", ["```\n"]) == (7, "```\n")
    assert find_stop("ab}cd```\n", ["```\n", "}"]) == (3, "}")  # the earliest end wins
    assert find_stop("ab}}", ["}", "}}"]) == (3, "}")
    assert find_stop("a\\boxed{1}", ["}", "d{1}"]) == (10, "d{1}")  # same end: the longer one
    assert find_stop("}..}", ["}"], search_from=1) == (4, "}")
    assert find_stop("nothing", ["}"]) is None


def _printable_stop(text: str) -> tuple[str, int]:
    """A 2-character ASCII stop string that first occurs at or after position 3 of text."""
    for i in range(3, len(text) - 1):
        s = text[i : i + 2]
        if s.isascii() and s.isprintable() and text.find(s) == i:
            return s, i
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_cuts_text_tokens_and_logprobs_consistently(tiny, engine):
    model, tok = tiny
    prompt = chat(tok, "stop here")
    full = engine.generate([prompt], max_new_tokens=60, greedy=True, ignore_eos=True)[0][0]
    stop, at = _printable_stop(full.text)
    cut = engine.generate([prompt], max_new_tokens=60, greedy=True, ignore_eos=True, stop=["never-there", stop])[0][0]
    assert cut.finish_reason == "stop" and cut.stop_str == stop
    assert cut.text == full.text[: at + len(stop)]
    k = len(cut.token_ids)
    assert cut.token_ids == full.token_ids[:k] and cut.logprobs == pytest.approx(full.logprobs[:k], abs=1e-6)
    # The shortest prefix of tokens whose decoding holds the stop string.
    assert stop in tok.decode(cut.token_ids) and stop not in tok.decode(cut.token_ids[:-1])
    # Sampling with stop strings: every completion that stopped on one ends right after it.
    for c in engine.generate([prompt], n=6, max_new_tokens=40, seed=3, stop=["e", "a", "1"])[0]:
        if c.stop_str is not None:
            assert c.finish_reason == "stop" and c.text.endswith(c.stop_str)
            assert sum(c.text.count(s) for s in ["e", "a", "1"]) == 1
        ref, _ = teacher_forced(model, c.prompt_ids, c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


@pytest.fixture(scope="module")
def eos_prone(tiny):
    """The tiny model with a bias towards eos, so that sampled sequences end by eos."""
    model, tok = tiny
    m = copy.deepcopy(model)
    head = torch.nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(m.lm_head.weight)
        head.bias.zero_()
        head.bias[tok.eos_token_id] = 4.0
    m.lm_head = head
    return m, tok


def test_eos_ends_a_sequence_and_stays_out_of_the_text(eos_prone):
    model, tok = eos_prone
    eng = build_rollout(RolloutConfig(), model, tok)
    outs = eng.generate([chat(tok, "end soon")], n=6, max_new_tokens=64, seed=0)[0]
    ended = [c for c in outs if c.finish_reason == "stop"]
    assert ended, "the eos bias should end some sequences"
    for c in ended:
        assert c.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in c.token_ids[:-1]
        assert c.stop_str is None and "<|im_end|>" not in c.text
        assert c.text == tok.decode(c.token_ids[:-1], skip_special_tokens=True)
        ref, _ = teacher_forced(model, c.prompt_ids, c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
    forced = eng.generate([chat(tok, "end soon")], n=2, max_new_tokens=30, seed=0, ignore_eos=True)[0]
    assert all(len(c.token_ids) == 30 and c.finish_reason == "length" for c in forced)


def test_the_context_limit_ends_with_length_and_a_too_long_prompt_is_an_error():
    model, tok = load_model(ModelConfig(name="t", source="tiny_random", dtype="float32", device="cpu",
                                          max_position_embeddings=40))
    eng = build_rollout(RolloutConfig(), model, tok)
    c = eng.generate([[5] * 30], max_new_tokens=50, greedy=True, ignore_eos=True)[0][0]
    assert len(c.token_ids) == 10 and c.finish_reason == "length"
    with pytest.raises(ValueError, match="no room"):
        eng.generate([[5] * 40], max_new_tokens=5)


# ----------------------------------------------------------------------------- segments


def test_continue_segments_and_flatten(tiny, engine):
    model, tok = tiny
    prompt_ids = tok(chat(tok, "compute 2+2"), add_special_tokens=False)["input_ids"]
    ctx = [Segment.inserted(prompt_ids)]
    first = engine.continue_segments([ctx], n=1, max_new_tokens=8, seed=0, ignore_eos=True)[0][0]
    assert first.prompt_ids == prompt_ids
    ctx = ctx + [first.as_segment(), Segment.from_text(tok, "\n```output\n4\n```\n")]
    seconds = engine.continue_segments([ctx, ctx[:1]], n=2, max_new_tokens=6, temperature=0.8, seed=1, ignore_eos=True)
    assert [len(r) for r in seconds] == [2, 2]
    second = seconds[0][1]
    token_ids, mask, old = flatten_segments(ctx)
    assert second.prompt_ids == token_ids
    ref, _ = teacher_forced(model, second.prompt_ids, second.token_ids, temperature=0.8)
    assert torch.allclose(torch.tensor(second.logprobs), ref, atol=1e-4)

    full = ctx + [second.as_segment()]
    token_ids, mask, old = flatten_segments(full)
    obs = len(ctx[2].token_ids)
    assert len(token_ids) == len(mask) == len(old)
    assert mask == [0] * len(prompt_ids) + [1] * 8 + [0] * obs + [1] * 6
    assert old[len(prompt_ids) : len(prompt_ids) + 8] == first.logprobs
    assert old[-6:] == second.logprobs
    assert all(o == 0.0 for o, m in zip(old, mask) if m == 0)


def test_segment_validation():
    with pytest.raises(ValueError, match="behaviour logprob"):
        Segment([1, 2], trainable=True)
    with pytest.raises(ValueError, match="behaviour logprob"):
        Segment([1, 2], trainable=True, logprobs=[-0.1])
    with pytest.raises(ValueError, match="finish_reason"):
        Completion([1], [2], "x", [-0.5], finish_reason="eos")
    with pytest.raises(TypeError):
        flatten_segments([[1, 2]])
    assert flatten_segments([]) == ([], [], [])


# ----------------------------------------------------------------------------- weights and modes


def test_update_weights_follows_the_trainers_module(tiny):
    model, tok = tiny
    m = copy.deepcopy(model)
    eng = build_rollout(RolloutConfig(), m, tok)
    prompt = chat(tok, "weights")
    before = eng.generate([prompt], max_new_tokens=12, greedy=True, ignore_eos=True)[0][0]
    with torch.no_grad():  # an optimizer step on the shared module is seen at once
        m.lm_head.weight.add_(torch.randn_like(m.lm_head.weight, generator=torch.Generator().manual_seed(0)))
    eng.update_weights(m)
    after = eng.generate([prompt], max_new_tokens=12, greedy=True, ignore_eos=True)[0][0]
    assert after.token_ids != before.token_ids
    assert after.token_ids == teacher_forced(m, after.prompt_ids, after.token_ids)[1].tolist()
    eng.update_weights(model)  # another module: re-bound
    assert eng.generate([prompt], max_new_tokens=12, greedy=True, ignore_eos=True)[0][0].token_ids == before.token_ids
    with pytest.raises(TypeError):
        eng.update_weights(model.state_dict())


def test_generation_restores_the_training_mode(tiny):
    model, tok = tiny
    m = copy.deepcopy(model).train()
    build_rollout(RolloutConfig(), m, tok).generate(["abc"], max_new_tokens=3)
    assert m.training


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(prompts=[""]), ValueError, "empty"),
        (dict(prompts=[[1, 99999]]), ValueError, "outside the vocabulary"),
        (dict(prompts="abc"), TypeError, "list of strings"),
        (dict(prompts=[3.5]), TypeError, "prompt 0"),
        (dict(prompts=["a"], temperature=0.0), ValueError, "greedy=True"),
        (dict(prompts=["a"], top_p=0.0), ValueError, "top_p"),
        (dict(prompts=["a"], n=0), ValueError, "n=0"),
        (dict(prompts=["a"], max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(prompts=["a"], stop="}"), TypeError, "list of strings"),
        (dict(prompts=["a"], stop=[""]), ValueError, "non-empty"),
    ],
)
def test_bad_input_is_a_clear_error(engine, kwargs, err, match):
    with pytest.raises(err, match=match):
        engine.generate(**kwargs)


def test_unknown_backend_and_bad_contexts(tiny, engine):
    model, tok = tiny
    with pytest.raises(ValueError, match="rollout.backend"):
        build_rollout(RolloutConfig(backend="sglang"), model, tok)
    with pytest.raises(TypeError, match="list of Segment"):
        engine.continue_segments([Segment.inserted([1, 2])])
    with pytest.raises(ValueError, match="no tokens"):
        engine.continue_segments([[Segment.inserted([])]])
    assert engine.generate([], n=2) == []
