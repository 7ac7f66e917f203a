"""One rank of a DeepSpeed data-parallel run (launched by tests/distributed/test_data_parallel_deepspeed.py
under torchrun, gloo on CPU).

``trainer DUMP``: ZeRO-2 and ZeRO-3 trainers of the tiny random model recompute π_old of a batch (each rank its
micro-batches), take the same steps as the single-process torch trainer would on the same batches, then save a
checkpoint, take a step, load the checkpoint and take the step again; dumps this rank's weights, metrics and
recomputed log-probs.
``loop RUN_DIR DUMP OVERRIDES...``: runs or resumes an outer loop of ``experiment=tiny``; ``rollout=vllm``
runs here on :class:`CopyingEngine` (a copy of the weights, synced like vLLM's). Dumps the full weights.
``reference DUMP``: a ZeRO-3 trainer with π_ref precomputed takes :data:`REFERENCE_STEPS` updates (π_ref swapped in
from rank 0 from the second on; rank 1 runs one micro-batch of three and a zero-weight pad); dumps whether the rank
holds π_ref, the KL of each update and the full weights.
``paper RUN_DIR DUMP OVERRIDES...``: the same with an idle player's DeepSpeed state offloaded as on a GPU
(:func:`offload_as_on_a_gpu`), for the paper rehearsal (tests/distributed/paper_rehearsal.py); also dumps the
offload and reload calls, whether each model checkpoints its activations and the rollout engine's class.
``paper-vllm RUN_DIR DUMP OVERRIDES...``: ``paper`` with ``rollout=vllm`` on vLLM's own engine, one per rank (no
stand-in; ``.venv-vllm``, tests/distributed/test_paper_rehearsal_vllm.py).
Several jobs separated by ``--`` run one after the other in the same launch (one start-up of the ranks,
DeepSpeed and the process group for all of them).
"""
from __future__ import annotations

import contextlib
import copy
import os
import sys
from pathlib import Path

import torch

from unifiedplayers import lora  # noqa: E402
from unifiedplayers.config import compose  # noqa: E402
from unifiedplayers.distributed import destroy, init_distributed  # noqa: E402
from unifiedplayers.rollout.hf_engine import HFRollout  # noqa: E402
from unifiedplayers.loop.outer import OuterLoop  # noqa: E402
from unifiedplayers.trainer import build_trainer  # noqa: E402

from tests.trainer.trainer_helpers import synthetic_batch, tiny_model, trainer_config  # noqa: E402

STEPS = 2
REFERENCE_STEPS = 3
# ZeRO-2 with the reference as a copy, ZeRO-3 with the reference swapped into the (partitioned) policy.
BACKENDS = {"deepspeed_zero2": {"ref_mode": "copy"}, "deepspeed_zero3": {"ref_mode": "precompute"}}


def batches(count: int) -> list:
    """8 samples per batch in micro-batches of 3: rank 0 runs two, rank 1 one and a zero-weight pad."""
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(21)
    return [synthetic_batch(model, g) for _ in range(count)]


def trainers(dump: str, dist) -> None:
    data = batches(STEPS + 1)
    out = {}
    for backend, extra in BACKENDS.items():
        model, _ = tiny_model()
        trainer = build_trainer(trainer_config(backend=backend, kl_coef=0.05, **extra), model, dist=dist)
        trainer.start_outer_iteration()
        redone, forwards, ref_pass = copy.deepcopy(data[0]), [], trainer._ref_pass
        trainer._ref_pass = lambda module, mb: forwards.append(len(mb.input_ids)) or ref_pass(module, mb)
        trainer.recompute_old_logprobs(redone)  # rank 1: one micro-batch of three and a lockstep pad
        del trainer._ref_pass
        metrics = [trainer.update(b) for b in data[:STEPS]]
        steps = trainer.full_state_dict()
        ckpt = Path(dump).parent / f"ckpt-{backend}"
        trainer.save_checkpoint(ckpt)
        trainer.update(data[STEPS])
        after = trainer.full_state_dict()
        trainer.load_checkpoint(ckpt)
        trainer.update(data[STEPS])
        out[backend] = {"metrics": metrics, "steps": steps, "after": after, "again": trainer.full_state_dict(),
                        "old_logprobs": [s.old_logprobs for s in redone], "recompute_forwards": forwards}
    torch.save(out, f"{dump}.rank{dist.rank}.pt")


def reference(dump: str, dist) -> None:
    """Only rank 0 keeps π_ref under ZeRO-3 with ``ref_mode: precompute`` (tests/distributed/test_data_parallel_deepspeed.py)."""
    trainer = build_trainer(trainer_config(backend="deepspeed_zero3", ref_mode="precompute", kl_coef=0.1),
                            tiny_model()[0], dist=dist)
    trainer.start_outer_iteration()
    kl = [trainer.update(b)["actor/kl"] for b in batches(REFERENCE_STEPS)]
    torch.save({"holds_reference": trainer._ref_state is not None, "has_reference": trainer._has_reference,
                "kl": kl, "weights": trainer.full_state_dict()}, f"{dump}.rank{dist.rank}.pt")


class CopyingEngine(HFRollout):
    """The hf engine over its own copy of the weights, refreshed by ``update_weights`` as vLLM's is: what
    an engine per rank sees under ZeRO-3 (built and updated inside the trainer's gathered weights)."""

    def __init__(self, cfg, model, tokenizer) -> None:
        from transformers import AutoModelForCausalLM

        copy = AutoModelForCausalLM.from_config(model.config).to(next(model.parameters()).dtype).eval()
        copy.load_state_dict(self.weights(model))
        super().__init__(cfg, copy, tokenizer)

    @staticmethod
    def weights(model):
        """What the engine holds of ``model``: its weights; an adapter player's, with its adapter folded in (what
        vLLM computes from the backbone and the adapter it serves)."""
        if not isinstance(model, torch.nn.Module):
            return model
        return lora.merged_state(model) if lora.is_adapted(model) else model.state_dict()

    def update_weights(self, model) -> None:
        with torch.no_grad():
            self.model.load_state_dict(self.weights(model))


@contextlib.contextmanager
def offload_as_on_a_gpu(calls: list):
    """Within: what the trainer asks of DeepSpeed when a player goes idle and comes back runs on the CPU too. On a
    GPU, ``offload_state`` moves :func:`states_to_offload`'s states off the device (``engine.offload_states``) and
    ``_ensure_optimizer`` brings them back (``engine.reload_states``) before the player's next step or save; on a CPU
    there is nothing to move, so the trainer skips both. Here they are called around the trainer's own methods, in a
    GPU's order (offload first, reload after the trainer's own restore). Each call is appended to ``calls``."""
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

    from unifiedplayers.trainer.deepspeed_backend import DeepSpeedTrainer

    own = {name: DeepSpeedTrainer.__dict__.get(name) for name in ("offload_state", "_ensure_optimizer")}
    real_offload, real_ensure = DeepSpeedTrainer.offload_state, DeepSpeedTrainer._ensure_optimizer

    def offload_state(self, final: bool = False) -> None:
        if self.device.type == "cpu" and not getattr(self, "_moved_off", False):
            include = self.idle_offload_states()
            self.engine.offload_states(include=[OffloadStateTypeEnum(s) for s in include], pin_memory=False)
            self._moved_off = True
            calls.append(("offload", include))
        real_offload(self, final=final)

    def ensure_optimizer(self) -> None:
        real_ensure(self)
        if getattr(self, "_moved_off", False):
            self.engine.reload_states()
            self._moved_off = False
            calls.append(("reload", ()))

    DeepSpeedTrainer.offload_state, DeepSpeedTrainer._ensure_optimizer = offload_state, ensure_optimizer
    try:
        yield
    finally:
        for name, value in own.items():
            if value is None:
                delattr(DeepSpeedTrainer, name)
            else:
                setattr(DeepSpeedTrainer, name, value)


def loop(run_dir: str, dump: str, dist, *overrides: str, paper: bool = False, stand_in: bool = True) -> None:
    """``paper``: the rehearsal's dump, with the offload calls (:func:`offload_as_on_a_gpu`), whether each
    trainer's model checkpoints its activations, and the engine's class. ``stand_in``: ``rollout=vllm`` samples with
    :class:`CopyingEngine`; else with vLLM."""
    from unifiedplayers.trainer.logprobs import _activation_checkpointing

    cfg = compose(["experiment=tiny", *overrides])
    factory = CopyingEngine if cfg.rollout.backend == "vllm" and stand_in else None
    if os.environ.get("TOY_REWARD") == "1":  # every group a reward spread: the players move (tests/loop/toy_reward.py)
        import pytest

        from tests.loop import toy_reward

        toy_reward.install(pytest.MonkeyPatch())
    calls: list = []
    with offload_as_on_a_gpu(calls) if paper else contextlib.nullcontext():
        run = OuterLoop(cfg, run_dir, dist=dist, rollout_factory=factory)
        run.run()
    weights = {role: p.trainer.full_state_dict() if p.trainer is not None else p.model.state_dict()
               for role, p in run.players.items()}
    if paper:
        weights = {"weights": weights, "offload_calls": calls, "activation_checkpointing": {
            role: _activation_checkpointing(p.trainer.model) for role, p in run.players.items()},
            "engines": sorted({f"{type(e).__module__}.{type(e).__qualname__}" for e in run.team.engines.built()})}
    torch.save(weights, f"{dump}.rank{dist.rank}.pt")


def jobs(argv: list[str]) -> list[list[str]]:
    """``trainer DUMP -- loop RUN_DIR DUMP ...``: the jobs of one launch, in order."""
    out = [[]]
    for arg in argv:
        if arg == "--":
            out.append([])
        else:
            out[-1].append(arg)
    return [job for job in out if job]


def main(*argv: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed()
    try:
        for mode, *args in jobs(list(argv)):
            if mode == "trainer":
                trainers(args[0], dist)
            elif mode == "reference":
                reference(args[0], dist)
            else:
                loop(args[0], args[1], dist, *args[2:], paper=mode.startswith("paper"), stand_in=mode != "paper-vllm")
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
