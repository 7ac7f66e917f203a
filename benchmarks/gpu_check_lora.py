"""The one-GPU preset in the GPU check (``--backends ...,one_gpu_lora``): the three players of ``experiment=one_gpu``,
LoRA adapters on one frozen backbone they share (:mod:`unifiedplayers.lora`), each trained by a torch trainer of the
preset's settings (no entropy bank: the check has no held-out contexts), parked while idle as a run parks them.

The shape is Qwen3-1.7B-Base's whatever ``--shape`` the other units run (the toy under ``--shape tiny``), random
weights, frozen and cast to the compute dtype as ``Team.setup`` holds the backbone. Each trained player in turn
(``--players``) runs a block: the iteration starts (π_ref := its adapter), then ``--steps`` phases of sampling with our
hf engine, advantages +1 / -1 within each group, π_old recomputed, one update. The items:

- ``shared_backbone``: each player's frozen tensors are the backbone's, and the storages hold one backbone and three
  adapters byte for byte; on GPU also ``memory_allocated`` after the build, within 5 % of that;
- ``initial_logprobs``: before any update each player's log-probs equal the backbone's bitwise (B = 0);
- ``grpo_steps``: finite losses, gradients, KL 0 at the iteration's first update; each block moved its own adapter
  and no other; no frozen tensor changed, bitwise;
- ``exact_resume``: the resume player's checkpoint after k updates holds its adapter alone; a new adapter player on
  the same backbone (A from another seed) loads it and repeats update k + 1 bitwise (adapter, loss, grad norm);
- ``peak_memory``: ``max_memory_allocated`` over the trainer's passes against the plan's trainer-pass instants
  (:func:`~benchmarks.gpu_check_common.memory_verdict`): the check samples with the hf engine, the preset with a vLLM
  engine asleep through these passes, so the plan's generation instant is not what the check runs.
"""
from __future__ import annotations

import copy
import math
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check_common import (GIB, PLAYERS, Clock, Unit, build_model, compare, count_parameters,
                                         deterministic, memory_detail, memory_verdict, mib, parameters_label,
                                         planned_peak, prompt_length, qwen3_config, release, render_prompts, scratch,
                                         tensors_on_host)

BUILD_TOLERANCE = 0.05  # memory_allocated after the build against one backbone and three adapters
TRAINER_PASSES = ("no-grad", "forward", "backward", "step")  # the plan's instants that the check measures
PROBE_ROWS, PROBE_TOKENS = 2, 64  # initial_logprobs: random byte ids
SHOWN_SETTINGS = ("backend", "lr", "kl_coef", "ref_mode", "recompute_old_logprobs", "gradient_checkpointing",
                  "micro_batch_size", "max_tokens_per_micro_batch", "logprob_chunk_rows", "dtype")


def unit_shape(shape: str) -> str:
    return "tiny" if shape == "tiny" else "qwen3_1_7b"


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
    adapters = sum(p["adapter_bytes"] for p in per_player.values())
    return {"shared": shared, "backbone_storages": len(base), "backbone_bytes": sum(base.values()),
            "adapter_bytes": adapters, "held_bytes": sum(held.values()),
            "expected_bytes": sum(base.values()) + adapters, "players": per_player}


def frozen_on_host(modules: dict) -> dict:
    """Every tensor of ``modules`` that no adapter owns (parameters and buffers), copied to the host once each."""
    return tensors_on_host((f"{label}.{name}", t) for label, module in modules.items()
                           for name, t in [*module.named_parameters(), *module.named_buffers()] if "lora_" not in name)


def adapter_on_host(player) -> dict:
    from unifiedplayers import lora

    return tensors_on_host(lora.adapter_state(player).items())


def _size(n: float) -> str:
    return f"{n / GIB:.3f} GiB" if n >= GIB / 4 else mib(n)


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
    verdict = "; ".join(item["problems"]) or "no other player's adapter moved, the backbone bitwise unchanged"
    return f"{per}; {verdict} ({item['frozen_tensors']} frozen tensors compared)"


def _resume_detail(item: dict) -> str:
    where = "the adapter alone" if item["adapter_only"] else "NOT the adapter alone"
    same = "bitwise equal" if item["bitwise_equal"] else f"NOT equal (max |diff| {item['max_abs_diff']:.3g})"
    return (f"the {item['player']} player's checkpoint after update {item['after_update']}: {where} "
            f"({item['saved_tensors']} tensors), {mib(item['checkpoint_bytes'])} in all, saved in {item['save_s']} s; "
            f"a new adapter player on the same backbone loaded it in {item['load_s']} s "
            f"({'equal' if item['loaded_equal'] else 'NOT equal'}) and repeated update {item['after_update'] + 1}: "
            f"adapter {same}, loss {item['loss'][0]:+.6g} / {item['loss'][1]:+.6g}, grad norm "
            f"{item['grad_norm'][0]:.6g} / {item['grad_norm'][1]:.6g}; the update moved the adapter by up to "
            f"{item['moved_by']:.3g}")


def _memory_detail(item: dict) -> str:
    return (memory_detail(item, "max_memory_allocated over the trainer's passes") + "; the plan's trainer-pass "
            f"instants only: the check samples with the hf engine (its peak {item['generation_peak_bytes'] / GIB:.2f} "
            "GiB, not compared), the preset with vLLM, asleep in these passes")


class LoraUnit(Unit):
    """The adapter players of the module docstring, their blocks, and the items they decide."""

    NAME, WHAT = "one_gpu_lora", "the one-GPU preset's adapter players"
    ITEMS = ("shared_backbone", "initial_logprobs", "grpo_steps", "exact_resume", "peak_memory")
    NOT_CHECKED = {"vLLM serving the adapters (a LoRARequest per player, asleep through updates)":
                   "its CUDA wheel is too large to carry",
                   "Qwen3-1.7B-Base's own weights": "random weights of its shape: nothing is downloaded"}
    DETAILS = {"shared_backbone": _shared_detail, "initial_logprobs": _logprobs_detail, "grpo_steps": _steps_detail,
               "exact_resume": _resume_detail, "peak_memory": _memory_detail}

    def __init__(self, check) -> None:
        super().__init__(check)
        self.shape = unit_shape(self.args.shape)
        self.config = qwen3_config(self.shape, tokenizer=check.tokenizer)
        self.parameters = count_parameters(self.config)
        self.roles = [r for r in PLAYERS if r in self.args.players]  # the players that train; all three are built
        self.resume_role = "execution" if "execution" in self.roles else self.roles[0]
        self.k = max(1, self.args.resume_after)
        self.seed = self.args.seed + 700
        self.backbone: Any = None
        self.players: dict[str, Any] = {}
        self.trainers: dict[str, Any] = {}
        self.saved: dict[str, Any] = {}  # the resume player around update k + 1 (exact_resume)
        self.allocated_at_start = 0

    @staticmethod
    def headline(unit: dict) -> str:
        return (f"experiment=one_gpu's three adapter players on the {unit['shape']} shape "
                f"({parameters_label(unit['parameters'])} parameters, random weights), torch backend, {unit['dtype']}, "
                f"peft {unit['peft']}; settings {unit.get('settings')}")

    def run(self) -> dict:
        import peft

        report: dict[str, Any] = {"status": "ran", "preset": "one_gpu", "shape": self.shape,
                                  "parameters": self.parameters, "dtype": self.check.dtype_name, "trained": self.roles,
                                  "peft": peft.__version__, "not_checked": dict(self.NOT_CHECKED)}
        with scratch(self.args, "gpu-check-lora-") as directory:
            try:
                self.guard("settings", lambda: self._settings(directory / "offload"))
                if "settings" in self.parts:
                    report["settings"] = self.parts["settings"]["shown"]
                    self.guard("plan", self._plan)
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
        report["items"] = self._items()
        report["errors"] = self.errors
        return report

    def _all_players(self, ckpt: Path) -> None:
        """Build, probe, train each player in turn, compare the frozen tensors, replay the resume player."""
        self.guard("build", self._build_players)
        if "build" not in self.parts:
            return
        self.guard("logprobs", self._initial_logprobs)
        self.guard("trainers", self._build_trainers)
        if "trainers" not in self.parts:
            return
        frozen = frozen_on_host({"backbone": self.backbone, **self.players})
        self.parts["adapters"] = {r: adapter_on_host(self.players[r]) for r in PLAYERS}
        for role in self.roles:
            if self.check.over_budget():
                self.skipped[f"block {role}"] = f"time budget of {self.args.budget_s} s spent"
                continue
            self.guard(f"block {role}", partial(self._block, role, ckpt))
        self.guard("frozen", partial(self._frozen_unchanged, frozen))
        del frozen
        if "after" in self.saved:
            self.guard("resume", partial(self._resumed, ckpt))

    def _allocated(self) -> int:
        if not self.cuda:
            return 0
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(self.check.device)

    def _settings(self, offload_dir: Path) -> dict:
        from omegaconf import OmegaConf

        from unifiedplayers.config import compose, role_trainer_config

        dtype = self.check.dtype_name
        cfg = compose(["experiment=one_gpu", f"trainer.dtype={dtype}", f"model.dtype={dtype}",
                       "trainer.entropy_bank_size=0"])
        trainers = {r: OmegaConf.merge(role_trainer_config(cfg.trainer, r), {"offload_dir": str(offload_dir)})
                    for r in PLAYERS}
        shown = {k: trainers[self.resume_role][k] for k in SHOWN_SETTINGS}
        shown["lora"] = OmegaConf.to_container(cfg.trainer.lora)
        return {"cfg": cfg, "trainers": trainers, "lora": cfg.trainer.lora, "shown": shown}

    def _plan(self) -> dict:
        prompts = {r: prompt_length(self.check.tokenizer, r, self.args.prompts) for r in self.roles}
        return planned_peak(self.check, self.parts["settings"]["cfg"], self.config, prompts, TRAINER_PASSES)

    def _build_players(self) -> dict:
        """The frozen backbone in the compute dtype and the three adapter players on it (``Team.setup``'s way)."""
        from unifiedplayers import lora
        from unifiedplayers.models import cast_parameters

        self.allocated_at_start = self._allocated()
        t0 = time.perf_counter()
        backbone = lora.freeze(build_model(self.config, self.check.device, self.seed))
        self.backbone = cast_parameters(backbone, self.check.dtype)
        for i, role in enumerate(PLAYERS):
            self.players[role] = lora.add_adapter(lora.share_base(self.backbone), self.parts["settings"]["lora"],
                                                  seed=self.seed * 3 + i).eval()
        return {"build_s": round(time.perf_counter() - t0, 3), **sharing(self.backbone, self.players)}

    def _build_trainers(self) -> dict:
        """A torch trainer for each trained player, parked and in eval mode until its block."""
        for role in self.roles:
            self.trainers[role] = self._trainer(role, self.players[role])
        release()
        return {"allocated_bytes": self._allocated() - self.allocated_at_start} if self.cuda else {}

    def _initial_logprobs(self) -> dict:
        """Each player's log-probs of random byte ids against the backbone's, before any update."""
        from unifiedplayers import lora
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
                zero = all(not t.any() for n, t in lora.adapter_state(player).items() if "lora_B" in n)
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
            self.peak(reset=True)
            seed = self.seed * 1000 + 10 * PLAYERS.index(role) + step
            groups, gen_s = check.sample(engine, trainer, prompts, seed=seed)
            generation_peak = self.peak()
            batch = check.train_samples(groups)
            resume_here = a.resume and role == self.resume_role and step == self.k
            if resume_here:
                self.saved = self._save(trainer, batch, ckpt)
            engine.forget_prefixes()  # the hf engine's prompt caches are no part of the trainer's passes
            steps.append({"step": step + 1, "generation_s": round(gen_s, 3), "generation_peak_bytes": generation_peak,
                          **self._update(trainer, batch)})
            if resume_here:
                self.saved.update(after=adapter_on_host(self.players[role]), metrics=steps[-1])
        trainer.offload_state()
        del engine
        release()
        before, after = self.parts["adapters"], {r: adapter_on_host(self.players[r]) for r in PLAYERS}
        self.parts["adapters"] = after
        print(f"  {self.NAME}/{role}: " + "; ".join(
            f"step {s['step']} generation {s['generation_s']:.2f} s, passes {s['passes_s']:.2f} s, loss "
            f"{s['loss']:+.4g}, KL {s['kl']:.3g}" for s in steps), flush=True)
        return {"steps": steps, "adapter_moved_by": compare(before[role], after[role])[1],
                "others_unchanged": {r: compare(before[r], after[r])[0] for r in PLAYERS if r != role}}

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
        self.peak(reset=True)
        clock = Clock(self.check.device)
        with clock():
            trainer.recompute_old_logprobs(batch)
            trainer.model.train()
            try:
                m = trainer.update(batch, on_policy=True)
            finally:
                trainer.model.eval()
        return {"passes_s": round(clock.seconds, 3), "passes_peak_bytes": self.peak(), "loss": m["actor/loss"],
                "kl": m.get("actor/kl", 0.0), "grad_norm": m["actor/grad_norm"],
                "trained_tokens": sum(int(sum(s.loss_mask)) for s in batch)}

    def _save(self, trainer, batch: list, path: Path) -> dict:
        """The checkpoint before update k + 1, the samples of that update and the adapter it starts from."""
        from unifiedplayers import lora
        from unifiedplayers.rundir import MODEL_WEIGHTS

        t0 = time.perf_counter()
        trainer.save_checkpoint(path)
        save_s = time.perf_counter() - t0
        saved = torch.load(path / MODEL_WEIGHTS, map_location="cpu", weights_only=True)
        player = self.players[self.resume_role]
        return {"batch": copy.deepcopy(batch), "before": adapter_on_host(player), "save_s": round(save_s, 3),
                "adapter_only": set(saved) == set(lora.adapter_state(player)), "saved_tensors": len(saved),
                "checkpoint_bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file())}

    def _resumed(self, path: Path) -> dict:
        """A new adapter player on the same backbone loads the checkpoint and takes update k + 1 on its samples."""
        from unifiedplayers import lora

        t = self.saved
        player = lora.add_adapter(lora.share_base(self.backbone), self.parts["settings"]["lora"],
                                  seed=self.seed * 3 + 100)
        trainer = self._trainer(self.resume_role, player)
        t0 = time.perf_counter()
        trainer.load_checkpoint(path)
        load_s = time.perf_counter() - t0
        loaded, _ = compare(adapter_on_host(player), t["before"])
        m = self._update(trainer, t["batch"])
        equal, diff = compare(adapter_on_host(player), t["after"])
        release(trainer)
        del trainer, player
        return {"loaded_equal": loaded, "bitwise_equal": equal, "max_abs_diff": diff, "load_s": round(load_s, 3),
                "loss": [t["metrics"]["loss"], m["loss"]], "grad_norm": [t["metrics"]["grad_norm"], m["grad_norm"]],
                "moved_by": compare(t["before"], t["after"])[1]}

    def _items(self) -> dict:
        """Each item from the records of the parts it needs (the functions below), or why it cannot be decided."""
        blocks = tuple(f"block {r}" for r in self.roles)
        resume = None
        if not self.args.resume:
            resume = {"status": "NOT RUN", "reason": "--no-resume"}
        elif self.args.steps <= self.k:
            resume = {"status": "NOT RUN", "reason": f"needs --steps > --resume-after ({self.args.steps} <= {self.k})"}
        return {
            "shared_backbone": self.blocked("build", "trainers") or shared_item(self.parts, self.cuda),
            "initial_logprobs": self.blocked("logprobs") or logprobs_item(self.parts["logprobs"]),
            "grpo_steps": self.blocked(*blocks, "frozen") or steps_item(self.parts, self.roles, self.args.steps),
            "exact_resume": resume or self.blocked(f"block {self.resume_role}", "resume") or resume_item(
                self.saved, self.parts["resume"], self.resume_role, self.k),
            "peak_memory": self.blocked("plan", *(blocks if self.cuda else ())) or memory_item(self.parts, self.roles,
                                                                                                self.cuda),
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
    if not cuda:
        return memory_verdict(parts["plan"], None, cuda)
    steps = [s for r in roles for s in parts[f"block {r}"]["steps"]]
    return memory_verdict(parts["plan"], max(s["passes_peak_bytes"] for s in steps), cuda,
                          generation_peak_bytes=max(s["generation_peak_bytes"] for s in steps))
