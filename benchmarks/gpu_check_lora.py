"""The one-GPU preset in the GPU check (``benchmarks/gpu_check.py --backends ...,one_gpu_lora``): the three players of
``experiment=one_gpu``, LoRA adapters on one frozen backbone they share (:mod:`unifiedplayers.lora`), on its shape with
random weights, a torch-backend trainer each with the preset's settings, a few GRPO steps each.

**Shape and settings.** Qwen3-1.7B-Base's shape (the check's ``qwen3_1_7b``, whatever ``--shape`` the other units run;
``--shape tiny``: the 2-layer toy, the CPU rehearsal), random weights, frozen and cast to the check's compute dtype
(bf16 on a bf16 GPU, float32 on CPU), as a run's team holds the backbone (``loop/team.py``, ``Team.setup``). Three
players ``lora.add_adapter(lora.share_base(backbone), trainer.lora, seed=...)`` (rank 16, alpha 32, every projection
of the decoder layers). Each trained one (``--players``) gets a torch trainer of the preset's ``trainer`` settings
(π_old recomputed, ref_mode precompute, gradient checkpointing, token-budget micro-batches, lr 1e-5, β = 0.04), the
compute dtype as above and no entropy bank (the check has no held-out contexts), and is parked (``offload_state``) as a
run parks an idle player.

**Blocks.** Each trained player in turn: the iteration starts (π_ref := its adapter), then ``--steps`` phases of
``--prompts`` x ``--samples`` completions of ``--max-new-tokens`` tokens from our hf engine (the player's own module,
eos ignored), advantages +1 / -1 within each group, π_old recomputed, one update; then it is parked again.

**Items**, each printed as ``one_gpu_lora <item>: PASS | FAIL | NOT RUN (reason)`` and written under "one_gpu_lora":

- ``shared_backbone``: every frozen parameter and buffer of each player is a tensor of the backbone, and the storages
  of the backbone and the players together hold one backbone and three adapters, byte for byte; on GPU also
  ``torch.cuda.memory_allocated`` once the players and their trainers are built: the same within 5 %.
- ``initial_logprobs``: before any update each player's log-probs of random byte ids equal the backbone's bitwise
  (B = 0: W x + (α / r) B A x is W x).
- ``grpo_steps``: each player's steps ran with a finite loss, a gradient (grad norm > 0) and KL 0 at the iteration's
  first update (π = π_ref); its block moved its adapter and no other player's; no frozen tensor of the backbone or of
  any player changed, bitwise, over all the blocks.
- ``exact_resume``: the resume player (Execution where it trains) saves a checkpoint after ``--resume-after`` k
  updates, which must hold its adapter alone, then takes update k + 1; a new adapter player on the same backbone (its A
  drawn from another seed) loads the checkpoint and takes update k + 1 on the same samples: its adapter, loss and grad
  norm must equal the uninterrupted update's bitwise (the update having moved the adapter). On GPU under
  ``torch.use_deterministic_algorithms``, as every exact check of the GPU check.
- ``peak_memory``: ``torch.cuda.max_memory_allocated`` over the trainer's passes (π_old recomputed and the update,
  from a reset just before them) against the capacity plan (``unifiedplayers.capacity``) of the same: one GPU, this
  shape, these settings, the three adapter players, rows of prompt + ``--max-new-tokens`` tokens. Compared with the
  plan's trainer-pass instants only (no-grad, forward, backward, step), without its fixed CUDA-context item: the check
  samples with the hf engine, the preset with a vLLM engine that sleeps through these passes, so the plan's
  generation instant is not what the check runs. PASS within the paper unit's band (plan x 0.5 .. x 1.1). On CPU:
  the plan's figure and NOT RUN (not measured on CPU).
- Listed as NOT CHECKED: vLLM serving the adapters (its CUDA wheel is too large to carry), the real weights.
"""
from __future__ import annotations

import copy
import math
import shutil
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks.gpu_check_model import (PLAYERS, build_model, count_parameters, parameters_label, qwen3_config,
                                        render_prompts)
from benchmarks.gpu_check_paper import MEMORY_BAND
from benchmarks.gpu_check_state import GIB, Clock, compare, deterministic, release

LORA_UNIT = "one_gpu_lora"  # its --backends entry in benchmarks/gpu_check.py
PRESET = "one_gpu"
ITEMS = ("shared_backbone", "initial_logprobs", "grpo_steps", "exact_resume", "peak_memory")
BUILD_TOLERANCE = 0.05  # memory_allocated after the build against one backbone and three adapters
TRAINER_PASSES = ("no-grad", "forward", "backward", "step")  # the plan's instants that the check measures
PROBE_ROWS, PROBE_TOKENS = 2, 64  # initial_logprobs: random byte ids
SHOWN_SETTINGS = ("backend", "lr", "kl_coef", "ref_mode", "recompute_old_logprobs", "gradient_checkpointing",
                  "micro_batch_size", "max_tokens_per_micro_batch", "logprob_chunk_rows", "dtype")
NOT_CHECKED = {
    "vLLM serving the adapters (a LoRARequest per player, asleep through updates)":
        "its CUDA wheel is too large to carry",
    "Qwen3-1.7B-Base's own weights": "random weights of its shape: nothing is downloaded",
}


def unit_shape(shape: str) -> str:
    """The unit's shape: the toy under ``--shape tiny`` (the CPU rehearsal), else the preset's backbone's."""
    return "tiny" if shape == "tiny" else "qwen3_1_7b"


def preset_config(dtype: str):
    """``experiment=one_gpu`` with the check's compute dtype and no entropy bank."""
    from unifiedplayers.config import compose

    return compose([f"experiment={PRESET}", f"trainer.dtype={dtype}", f"model.dtype={dtype}",
                    "trainer.entropy_bank_size=0"])


# ---------------------------------------------------------------------------------------------- tensors
def on_host(state: dict) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def storages(tensors) -> dict[int, int]:
    """``{storage address: bytes}`` of ``tensors``, each storage once."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def sharing(backbone, players: dict) -> dict:
    """Whether every player's frozen tensors are the backbone's, and the bytes that the backbone's and the players'
    storages hold together against one backbone and the players' adapters."""
    from unifiedplayers import lora

    base = storages([*backbone.parameters(), *backbone.buffers()])
    held, per_player = dict(base), {}
    for role, player in players.items():
        frozen, adapter = storages(lora.frozen_tensors(player)), storages(lora.adapter_parameters(player))
        held.update(frozen)
        held.update(adapter)
        per_player[role] = {"frozen_storages": len(frozen), "of_the_backbone": len(frozen.keys() & base.keys()),
                            "adapter_parameters": lora.adapter_parameter_count(player),
                            "adapter_bytes": sum(adapter.values())}
    shared = all(p["frozen_storages"] == p["of_the_backbone"] == len(base) for p in per_player.values())
    return {"shared": shared, "backbone_storages": len(base), "backbone_bytes": sum(base.values()),
            "adapter_bytes": sum(p["adapter_bytes"] for p in per_player.values()), "held_bytes": sum(held.values()),
            "expected_bytes": sum(base.values()) + sum(p["adapter_bytes"] for p in per_player.values()),
            "players": per_player}


def frozen_on_host(modules: dict) -> dict:
    """Every tensor of ``modules`` that no adapter owns (parameters and buffers), copied to the host once each."""
    seen, out = set(), {}
    for label, module in modules.items():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if "lora_" not in name and key not in seen:
                seen.add(key)
                out[f"{label}.{name}"] = t.detach().to("cpu", copy=True)
    return out


def planned_peak(check, cfg, config, prompt: dict[str, int], roles: list[str]) -> dict:
    """The capacity plan's largest trainer-pass instant (:data:`TRAINER_PASSES`) of the three adapter players on
    ``config``'s shape with ``cfg``'s settings, each trained role's mini-batch --prompts x --samples rows of
    ``prompt[role]`` + --max-new-tokens tokens; the figure compared is its total without the CUDA-context item."""
    import torch
    from dataclasses import replace

    from unifiedplayers import capacity

    a = check.args
    memory = torch.cuda.get_device_properties(check.device).total_memory if check.cuda else 24 * GIB
    machine = capacity.Hardware(gpus=1, gpu_memory=float(memory), bf16=check.dtype_name == "bfloat16",
                                name="the check's GPU" if check.cuda else "one 24 GiB GPU (the preset's)")
    arch = capacity.arch_from_config({**config.to_dict(), "model_type": "qwen3"}, "benchmarks/gpu_check.py shape")
    lora = cfg.trainer.lora
    setup = replace(capacity.setup_of(cfg, machine), arch=arch, n=arch.parameters, trained=tuple(roles),
                    adapter=arch.adapter_parameters(int(lora.rank), lora.target_modules))
    loads = {**capacity.role_loads(cfg), **{r: capacity.RoleLoad(r, a.prompts * a.samples, prompt[r],
                                                                  a.max_new_tokens, 0) for r in roles}}
    passes = [i for i in capacity.device_instants(setup, loads) if i.name.split(" ")[0] in TRAINER_PASSES]
    peak = max(passes, key=lambda i: i.total)
    fixed = sum(i.bytes for i in peak.items if i.name.startswith("CUDA context"))
    return {"instant": peak.name, "plan_bytes": peak.total, "compared_bytes": peak.total - fixed,
            "items": {i.name: i.bytes for i in peak.items}, "plan_parameters": arch.parameters,
            "plan_adapter_parameters": setup.adapter, "gpu_memory_bytes": float(memory)}


# ---------------------------------------------------------------------------------------------- the unit
class LoraUnit:
    """The adapter players of the module docstring, their blocks, and the items they decide."""

    def __init__(self, check) -> None:
        a = check.args
        self.check, self.args, self.cuda = check, a, check.cuda
        self.shape = unit_shape(a.shape)
        self.config = qwen3_config(self.shape, tokenizer=check.tokenizer)
        self.parameters = count_parameters(self.config)
        self.roles = [r for r in PLAYERS if r in a.players]  # the players that train; all three are built
        self.resume_role = "execution" if "execution" in self.roles else self.roles[0]
        self.k = max(1, a.resume_after)
        self.seed = a.seed + 700
        self.parts: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.backbone: Any = None
        self.players: dict[str, Any] = {}
        self.trainers: dict[str, Any] = {}
        self.saved: dict[str, Any] = {}  # the resume player around update k + 1 (exact_resume)
        self.allocated_at_start = 0

    def run(self) -> dict:
        """Every item, as a dict ``{"status": PASS | FAIL | NOT RUN, ...}`` under ``report["items"]``."""
        import peft

        report: dict[str, Any] = {"status": "ran", "preset": PRESET, "shape": self.shape,
                                  "parameters": self.parameters, "dtype": self.check.dtype_name,
                                  "trained": self.roles, "peft": peft.__version__, "not_checked": dict(NOT_CHECKED)}
        root = Path(self.args.ckpt_dir) if self.args.ckpt_dir else Path(tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="gpu-check-lora-", dir=root))
        try:
            self._guard("settings", lambda: self._settings(directory / "offload"))
            if "settings" in self.parts:
                report["settings"] = self.parts["settings"]["shown"]
                self._guard("plan", self._plan)
                with deterministic(self.cuda) as caught:
                    self._all_players(directory / "ckpt")
                report["determinism_warnings"] = caught
        finally:
            self.trainers.clear()
            self.players.clear()
            self.backbone = None
            for copy_ in ("batch", "before", "after"):  # the resume player's samples and adapters
                self.saved.pop(copy_, None)
            release()
            shutil.rmtree(directory, ignore_errors=True)
        report["items"] = self._items()
        report["errors"] = self.errors
        return report

    def _all_players(self, ckpt: Path) -> None:
        """Build, probe, train each player in turn, compare the frozen tensors, replay the resume player."""
        self._guard("build", self._build_players)
        if "build" not in self.parts:
            return
        self._guard("logprobs", self._initial_logprobs)
        self._guard("trainers", self._build_trainers)
        if "trainers" not in self.parts:
            return
        frozen = frozen_on_host({"backbone": self.backbone, **self.players})
        self.parts["adapters"] = {r: on_host(self._adapter(r)) for r in PLAYERS}
        for role in self.roles:
            if self.check.over_budget():
                self.skipped[f"block {role}"] = f"time budget of {self.args.budget_s} s spent"
                continue
            self._guard(f"block {role}", partial(self._block, role, ckpt))
        self._guard("frozen", partial(self._frozen_unchanged, frozen))
        del frozen
        if "after" in self.saved:
            self._guard("resume", partial(self._resumed, ckpt))

    def _guard(self, part: str, fn: Callable[[], dict]) -> None:
        """Run one part; an exception is recorded against it (the items that need it FAIL) and the next goes on."""
        try:
            self.parts[part] = fn()
        except Exception as exc:  # noqa: BLE001 - report it, go on with the next part
            traceback.print_exc()
            self.errors[part] = f"{type(exc).__name__}: {exc}"[:1000]
        release()

    def _blocked(self, *parts: str) -> Optional[dict]:
        """FAIL when a part the item needs raised or did not run, NOT RUN when the time budget skipped it; else None."""
        failed = [f"{p}: {self.errors[p]}" for p in parts if p in self.errors]
        if failed:
            return {"status": "FAIL", "reason": "; ".join(failed)}
        skipped = [f"{p}: {self.skipped[p]}" for p in parts if p in self.skipped]
        if skipped:
            return {"status": "NOT RUN", "reason": "; ".join(skipped)}
        missing = [p for p in parts if p not in self.parts]
        return {"status": "FAIL", "reason": f"not run: {', '.join(missing)}"} if missing else None

    def _adapter(self, role: str) -> dict:
        from unifiedplayers import lora

        return lora.adapter_state(self.players[role])

    def _allocated(self) -> int:
        import torch

        if not self.cuda:
            return 0
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(self.check.device)

    def _peak(self, reset: bool = False) -> Optional[int]:
        import torch

        if not self.cuda:
            return None
        torch.cuda.synchronize()
        if reset:
            torch.cuda.reset_peak_memory_stats(self.check.device)
        return torch.cuda.max_memory_allocated(self.check.device)

    # ------------------------------------------------------------------ the parts
    def _settings(self, offload_dir: Path) -> dict:
        from omegaconf import OmegaConf

        from unifiedplayers.config import role_trainer_config

        cfg = preset_config(self.check.dtype_name)
        trainers = {r: OmegaConf.merge(role_trainer_config(cfg.trainer, r), {"offload_dir": str(offload_dir)})
                    for r in PLAYERS}
        shown = {k: trainers[self.resume_role][k] for k in SHOWN_SETTINGS}
        shown["lora"] = OmegaConf.to_container(cfg.trainer.lora)
        return {"cfg": cfg, "trainers": trainers, "lora": cfg.trainer.lora, "shown": shown}

    def _plan(self) -> dict:
        tokenizer = self.check.tokenizer
        prompt = {r: max(len(tokenizer(p, add_special_tokens=False)["input_ids"])  # a micro-batch pads to its longest
                         for p in render_prompts(tokenizer, r, self.args.prompts)) for r in self.roles}
        return planned_peak(self.check, self.parts["settings"]["cfg"], self.config, prompt, self.roles)

    def _build_players(self) -> dict:
        """The frozen backbone in the compute dtype and the three adapter players on it (``Team.setup``'s way)."""
        from unifiedplayers import lora
        from unifiedplayers.models import cast_parameters

        check = self.check
        self.allocated_at_start = self._allocated()
        t0 = time.perf_counter()
        self.backbone = cast_parameters(lora.freeze(build_model(self.config, check.device, self.seed)), check.dtype)
        for i, role in enumerate(PLAYERS):
            self.players[role] = lora.add_adapter(lora.share_base(self.backbone), self.parts["settings"]["lora"],
                                                  seed=self.seed * 3 + i).eval()
        return {"build_s": round(time.perf_counter() - t0, 3), **sharing(self.backbone, self.players)}

    def _build_trainers(self) -> dict:
        """A torch trainer for each trained player, parked and in eval mode until its block as a run's team leaves
        it."""
        for role in self.roles:
            self.trainers[role] = self._trainer(role, self.players[role])
        release()
        return {"allocated_bytes": self._allocated() - self.allocated_at_start} if self.cuda else {}

    def _initial_logprobs(self) -> dict:
        """Each player's log-probs of random byte ids against the backbone's, before any update."""
        import torch

        from unifiedplayers.trainer import selected_token_logprobs

        g = torch.Generator().manual_seed(self.seed)
        ids = torch.randint(3, 259, (PROBE_ROWS, PROBE_TOKENS), generator=g).to(self.check.device)
        mask, select = torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool)
        select[:, 0] = False  # nothing predicts the first token
        with torch.no_grad():
            want = selected_token_logprobs(self.backbone, ids, mask, select).logprobs
            players = {}
            for role, player in self.players.items():
                got = selected_token_logprobs(player, ids, mask, select).logprobs
                zero = all(not t.any() for n, t in self._adapter(role).items() if "lora_B" in n)
                players[role] = {"bitwise_equal": bool(torch.equal(got, want)), "b_zero": zero,
                                 "max_abs_diff": float((got.float() - want.float()).abs().max())}
        return {"rows": PROBE_ROWS, "tokens": PROBE_TOKENS, "players": players}

    def _block(self, role: str, ckpt: Path) -> dict:
        """One player's block: ``--steps`` phases of sampling and one update each, then the player is parked."""
        check, a, trainer = self.check, self.args, self.trainers[role]
        trainer.start_outer_iteration()
        trainer.start_block()
        engine = check.engine_for(trainer)
        check.warm_up(engine)
        prompts = render_prompts(check.tokenizer, role, a.prompts)
        steps = []
        for step in range(a.steps):
            self._peak(reset=True)
            seed = self.seed * 1000 + 10 * PLAYERS.index(role) + step
            groups, gen_s = check.sample(engine, trainer, prompts, seed=seed)
            generation_peak = self._peak()
            batch = check.train_samples(groups)
            resume_here = a.resume and role == self.resume_role and step == self.k
            if resume_here:
                self.saved = self._save(trainer, batch, ckpt)
            engine.forget_prefixes()  # the hf engine's prompt caches are no part of the trainer's passes
            steps.append({"step": step + 1, "generation_s": round(gen_s, 3), "generation_peak_bytes": generation_peak,
                          **self._update(trainer, batch)})
            if resume_here:
                self.saved.update(after=on_host(self._adapter(role)), metrics=steps[-1])
        trainer.offload_state()
        del engine
        release()
        before, after = self.parts["adapters"], {r: on_host(self._adapter(r)) for r in PLAYERS}
        self.parts["adapters"] = after
        others = {r: compare(before[r], after[r])[0] for r in PLAYERS if r != role}
        print(f"  {LORA_UNIT}/{role}: " + "; ".join(
            f"step {s['step']} generation {s['generation_s']:.2f} s, passes {s['passes_s']:.2f} s, loss "
            f"{s['loss']:+.4g}, KL {s['kl']:.3g}" for s in steps), flush=True)
        return {"steps": steps, "adapter_moved_by": compare(before[role], after[role])[1],
                "others_unchanged": others}

    def _frozen_unchanged(self, before: dict) -> dict:
        """Every frozen tensor (the backbone's, and any player's own) against its copy from before the blocks."""
        equal, diff = compare(before, frozen_on_host({"backbone": self.backbone, **self.players}))
        return {"bitwise_equal": equal, "max_abs_diff": diff, "tensors": len(before)}

    def _trainer(self, role: str, player):
        from unifiedplayers.trainer import build_trainer

        trainer = build_trainer(self.parts["settings"]["trainers"][role], player, role=role,
                                pad_token_id=self.check.tokenizer.pad_token_id)
        trainer.offload_state()
        player.eval()
        return trainer

    def _update(self, trainer, batch: list) -> dict:
        """π_old recomputed, then one update in training mode (gradient checkpointing acts in it alone), as
        ``Team.recompute_old_logprobs`` and ``Team.update`` do; the peak memory of those passes alone."""
        self._peak(reset=True)
        clock = Clock(self.check.device)
        with clock():
            trainer.recompute_old_logprobs(batch)
            trainer.model.train()
            try:
                m = trainer.update(batch, on_policy=True)
            finally:
                trainer.model.eval()
        return {"passes_s": round(clock.seconds, 3), "passes_peak_bytes": self._peak(), "loss": m["actor/loss"],
                "kl": m.get("actor/kl", 0.0), "grad_norm": m["actor/grad_norm"],
                "trained_tokens": sum(int(sum(s.loss_mask)) for s in batch)}

    def _save(self, trainer, batch: list, path: Path) -> dict:
        """The checkpoint before update k + 1, the samples of that update and the adapter it starts from."""
        import torch

        from unifiedplayers.rundir import MODEL_WEIGHTS

        t0 = time.perf_counter()
        trainer.save_checkpoint(path)
        save_s = time.perf_counter() - t0
        saved = torch.load(path / MODEL_WEIGHTS, map_location="cpu", weights_only=True)
        return {"batch": copy.deepcopy(batch), "before": on_host(self._adapter(self.resume_role)),
                "save_s": round(save_s, 3), "adapter_only": set(saved) == set(self._adapter(self.resume_role)),
                "saved_tensors": len(saved),
                "checkpoint_bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file())}

    def _resumed(self, path: Path) -> dict:
        """A new adapter player on the same backbone loads the checkpoint and takes update k + 1 on its samples."""
        from unifiedplayers import lora

        role, t = self.resume_role, self.saved
        player = lora.add_adapter(lora.share_base(self.backbone), self.parts["settings"]["lora"],
                                  seed=self.seed * 3 + 100)
        trainer = self._trainer(role, player)
        t0 = time.perf_counter()
        trainer.load_checkpoint(path)
        load_s = time.perf_counter() - t0
        loaded, _ = compare(on_host(lora.adapter_state(player)), t["before"])
        m = self._update(trainer, t["batch"])
        equal, diff = compare(on_host(lora.adapter_state(player)), t["after"])
        release(trainer)
        del trainer, player
        return {"loaded_equal": loaded, "bitwise_equal": equal, "max_abs_diff": diff, "load_s": round(load_s, 3),
                "loss": [t["metrics"]["loss"], m["loss"]], "grad_norm": [t["metrics"]["grad_norm"], m["grad_norm"]],
                "moved_by": compare(t["before"], t["after"])[1]}

    # ------------------------------------------------------------------ the items
    def _items(self) -> dict:
        """Each item from the records of the parts it needs (the functions below), or why it cannot be decided."""
        blocks = tuple(f"block {r}" for r in self.roles)
        memory_parts = ("plan", *blocks) if self.cuda else ("plan",)
        resume = None
        if not self.args.resume:
            resume = {"status": "NOT RUN", "reason": "--no-resume"}
        elif self.args.steps <= self.k:
            resume = {"status": "NOT RUN", "reason": f"needs --steps > --resume-after ({self.args.steps} <= {self.k})"}
        return {
            "shared_backbone": self._blocked("build", "trainers") or shared_item(self.parts, self.cuda),
            "initial_logprobs": self._blocked("logprobs") or logprobs_item(self.parts["logprobs"]),
            "grpo_steps": self._blocked(*blocks, "frozen") or steps_item(self.parts, self.roles, self.args.steps),
            "exact_resume": resume or self._blocked(f"block {self.resume_role}", "resume") or resume_item(
                self.saved, self.parts["resume"], self.resume_role, self.k),
            "peak_memory": self._blocked(*memory_parts) or memory_item(self.parts, self.roles, self.cuda),
        }


def shared_item(parts: dict, cuda: bool) -> dict:
    built = parts["build"]
    passed = built["shared"] and built["held_bytes"] == built["expected_bytes"]
    if cuda:
        allocated = parts["trainers"]["allocated_bytes"]
        built = {**built, "allocated_bytes": allocated, "allocated_ratio": allocated / built["expected_bytes"]}
        passed = passed and abs(built["allocated_ratio"] - 1) <= BUILD_TOLERANCE
    return {"status": "PASS" if passed else "FAIL", **built}


def logprobs_item(probe: dict) -> dict:
    passed = all(p["bitwise_equal"] and p["b_zero"] for p in probe["players"].values())
    return {"status": "PASS" if passed else "FAIL", **probe}


def steps_item(parts: dict, roles: list[str], count: int) -> dict:
    players, problems = {}, []
    for role in roles:
        block = parts[f"block {role}"]
        steps = block["steps"]
        players[role] = {"loss": [s["loss"] for s in steps], "kl": [s["kl"] for s in steps],
                         "grad_norm": [s["grad_norm"] for s in steps], "adapter_moved_by": block["adapter_moved_by"],
                         "others_unchanged": block["others_unchanged"]}
        if len(steps) != count or not all(math.isfinite(s["loss"]) and s["grad_norm"] > 0 for s in steps):
            problems.append(f"{role}: a step without a finite loss or a gradient")
        if steps and steps[0]["kl"] != 0.0:
            problems.append(f"{role}: KL {steps[0]['kl']:.3g} at the iteration's first update (pi = pi_ref)")
        if not block["adapter_moved_by"] > 0:
            problems.append(f"{role}: its adapter did not move")
        problems += [f"{role}'s block changed {other}'s adapter" for other, same in block["others_unchanged"].items()
                     if not same]
    frozen = parts["frozen"]
    if not frozen["bitwise_equal"]:
        problems.append(f"the backbone changed (frozen tensors, max |diff| {frozen['max_abs_diff']:.3g})")
    return {"status": "FAIL" if problems else "PASS", "problems": problems, "players": players,
            "frozen_tensors": frozen["tensors"]}


def resume_item(saved: dict, resumed: dict, role: str, k: int) -> dict:
    kept = {key: saved[key] for key in ("adapter_only", "saved_tensors", "checkpoint_bytes", "save_s")}
    r = resumed
    passed = (kept["adapter_only"] and r["loaded_equal"] and r["bitwise_equal"] and r["loss"][0] == r["loss"][1]
              and r["grad_norm"][0] == r["grad_norm"][1] and r["moved_by"] > 0)
    return {"status": "PASS" if passed else "FAIL", "player": role, "after_update": k, **kept, **r}


def memory_item(parts: dict, roles: list[str], cuda: bool) -> dict:
    plan = parts["plan"]
    if not cuda:
        return {"status": "NOT RUN", "reason": f"not measured on CPU; the plan for one GPU: "
                f"{plan['compared_bytes'] / GIB:.3f} GiB ({plan['plan_bytes'] / GIB:.3f} GiB with the CUDA context) "
                f"at its '{plan['instant']}' instant", **plan}
    steps = [s for r in roles for s in parts[f"block {r}"]["steps"]]
    measured, compared = max(s["passes_peak_bytes"] for s in steps), plan["compared_bytes"]
    low, high = MEMORY_BAND
    return {"status": "PASS" if low * compared <= measured <= high * compared else "FAIL",
            "measured_bytes": measured, "band": [low, high], "ratio": measured / compared if compared else math.inf,
            "generation_peak_bytes": max(s["generation_peak_bytes"] for s in steps), **plan}


def run_unit(check) -> dict:
    return LoraUnit(check).run()


# ---------------------------------------------------------------------------------------------- the lines
def print_items(unit: dict) -> None:
    """One line per item, ``one_gpu_lora <item>: PASS | FAIL | NOT RUN (...)``, then the NOT CHECKED ones."""
    items = unit.get("items")
    if items is None:  # the unit did not start, or stopped on an error
        status = "FAIL" if unit.get("status") == "error" else "NOT RUN"
        items = {name: {"status": status, "reason": unit.get("reason", "")} for name in ITEMS}
    else:
        print(f"{LORA_UNIT}: experiment={PRESET}'s three adapter players on the {unit['shape']} shape "
              f"({parameters_label(unit['parameters'])} parameters, random weights), torch backend, {unit['dtype']}, "
              f"peft {unit['peft']}; settings {unit.get('settings')}")
    for name in ITEMS:
        item = items[name]
        detail = DETAILS[name](item) if item["status"] in ("PASS", "FAIL") and "reason" not in item else ""
        reason = item.get("reason") or detail
        print(f"{LORA_UNIT} {name}: {item['status']}" + (f" ({reason})" if reason else ""), flush=True)
    for name, why in NOT_CHECKED.items():
        print(f"{LORA_UNIT} {name}: NOT CHECKED ({why})")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _size(n: float) -> str:
    return f"{n / GIB:.3f} GiB" if n >= GIB / 4 else _mib(n)


def _shared_detail(item: dict) -> str:
    counts = {p["adapter_parameters"] for p in item["players"].values()}
    tensors = ("every frozen tensor of each player is the backbone's" if item["shared"] else
               "NOT the backbone's tensors: " + ", ".join(f"{r} {p['of_the_backbone']} of {p['frozen_storages']}"
                                                          for r, p in item["players"].items()))
    line = (f"{tensors} ({item['backbone_storages']} storages); held {_size(item['held_bytes'])} against one "
            f"backbone {_size(item['backbone_bytes'])} + {len(item['players'])} adapters of "
            f"{'/'.join(parameters_label(c) for c in sorted(counts))} parameters ({_size(item['adapter_bytes'])})")
    if "allocated_ratio" in item:
        line += (f"; memory_allocated after the build {_size(item['allocated_bytes'])}: x "
                 f"{item['allocated_ratio']:.3f} of that, PASS within {BUILD_TOLERANCE:.0%}")
    return line


def _logprobs_detail(item: dict) -> str:
    same = ", ".join(f"{r} {'bitwise equal' if p['bitwise_equal'] else 'max |diff| %.3g' % p['max_abs_diff']}"
                     + ("" if p["b_zero"] else " (B not zero)") for r, p in item["players"].items())
    return f"each player's log-probs of {item['rows']} x {item['tokens']} random byte ids vs the backbone's: {same}"


def _steps_detail(item: dict) -> str:
    per = "; ".join(f"{r}: loss {', '.join(f'{x:+.4g}' for x in p['loss'])}, "
                    f"KL {', '.join(f'{x:.3g}' for x in p['kl'])}, adapter moved by up to {p['adapter_moved_by']:.3g}"
                    for r, p in item["players"].items())
    verdict = "; ".join(item["problems"]) if item["problems"] else (
        "no other player's adapter moved, the backbone bitwise unchanged")
    return f"{per}; {verdict} ({item['frozen_tensors']} frozen tensors compared)"


def _resume_detail(item: dict) -> str:
    where = "the adapter alone" if item["adapter_only"] else "NOT the adapter alone"
    same = "bitwise equal" if item["bitwise_equal"] else f"NOT equal (max |diff| {item['max_abs_diff']:.3g})"
    return (f"the {item['player']} player's checkpoint after update {item['after_update']}: {where} "
            f"({item['saved_tensors']} tensors), {_mib(item['checkpoint_bytes'])} in all, saved in {item['save_s']} s; "
            f"a new adapter player on the same backbone loaded it in {item['load_s']} s "
            f"({'equal' if item['loaded_equal'] else 'NOT equal'}) and repeated update {item['after_update'] + 1}: "
            f"adapter {same}, loss {item['loss'][0]:+.6g} / {item['loss'][1]:+.6g}, grad norm "
            f"{item['grad_norm'][0]:.6g} / {item['grad_norm'][1]:.6g}; the update moved the adapter by up to "
            f"{item['moved_by']:.3g}")


def _memory_detail(item: dict) -> str:
    low, high = item["band"]
    return (f"max_memory_allocated over the trainer's passes {item['measured_bytes'] / GIB:.2f} GiB vs the plan's "
            f"{item['compared_bytes'] / GIB:.2f} GiB ({item['plan_bytes'] / GIB:.2f} GiB with the CUDA context) at "
            f"its '{item['instant']}' instant: x {item['ratio']:.2f}, PASS within x {low} .. x {high}; the plan's "
            f"trainer-pass instants only: the check samples with the hf engine (its peak "
            f"{item['generation_peak_bytes'] / GIB:.2f} GiB, not compared), the preset with vLLM, asleep in these "
            f"passes")


DETAILS = {"shared_backbone": _shared_detail, "initial_logprobs": _logprobs_detail, "grpo_steps": _steps_detail,
           "exact_resume": _resume_detail, "peak_memory": _memory_detail}
