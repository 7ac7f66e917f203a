"""One rank of a two-rank torchrun job with an in-process vLLM engine per rank (launched by
tests/rollout/test_rollout_vllm.py in the vllm environment): every rank builds its engine, samples its own share
(different counts and lengths per rank: no lockstep), pushes its own weights (different per rank, as a
stand-in for its trainer's step) and checks that its engine now decodes greedily as its own hf model does.
Writes ``DUMP.rank<r>.pt`` with the greedy tokens of both backends."""
from __future__ import annotations

import os
import sys

import torch

from unifiedplayers.config import ModelConfig, RolloutConfig
from unifiedplayers.distributed import destroy, init_distributed
from unifiedplayers.models import load_model
from unifiedplayers.rollout import build_rollout


def main(dump: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.set_num_threads(1)
    dist = init_distributed()
    try:
        model, tok = load_model(ModelConfig(name="tiny", source="tiny_random", dtype="float32", device="cpu", seed=0))
        cfg = RolloutConfig(backend="vllm", max_model_len=256, enforce_eager=True, gpu_memory_utilization=0.3)
        engine, hf = build_rollout(cfg, model, tok), build_rollout(RolloutConfig(backend="hf"), model, tok)
        share = engine.generate(["sample"] * (1 + dist.rank), n=2 + dist.rank, max_new_tokens=4 + 8 * dist.rank,
                                seed=dist.rank, ignore_eos=True)
        assert [len(c.token_ids) for row in share for c in row] == [4 + 8 * dist.rank] * (1 + dist.rank) * (2 + dist.rank)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5 + dist.rank)
        engine.update_weights(model)
        kw = dict(max_new_tokens=12, greedy=True, ignore_eos=True)
        out = {"vllm": engine.generate(["weights"], **kw)[0][0].token_ids,
               "hf": hf.generate(["weights"], **kw)[0][0].token_ids}
        torch.save(out, f"{dump}.rank{dist.rank}.pt")
        dist.barrier()
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
