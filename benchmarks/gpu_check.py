"""GPU check: the paper preset's model shapes with random weights, through our rollout, sandbox and trainer.

For a machine with one GPU, no network and none of Hydra, DeepSpeed or PEFT (``experiments/gpu_check.sh`` carries
them as wheels). Per player and trainer backend (``--backends torch,deepspeed_zero2,...``; a player run each): a
``Qwen3ForCausalLM`` of Qwen3-4B-Base's shape (``--shape qwen3_4b``; ``qwen3_1_7b``; ``tiny``, a 2-layer toy) with
seeded random weights, the byte tokenizer (the 4B keeps its 151,936-row vocabulary: the text is not the point), and
``--steps`` steps of sampling, the sandbox and one optimizer step (``gpu_check_players``), then an exact-resume check
on the shape cut to 2 layers where a full checkpoint would be too large (``--resume-layers``). vLLM is not run: its
CUDA wheel alone is far over what can be carried.

Printed and written to ``--out``/gpu_check.json (rewritten after every unit, so a run cut short by ``--budget-s``
keeps what it measured): generation tokens/s (after one untimed warm-up call), the time split (generation; sandbox;
log-prob passes = ``perf/time_ref`` + ``perf/time_forward``; update = ``perf/time_backward`` +
``perf/time_optimizer`` (+ ``perf/time_weight_sync``)), peak memory and the exact-resume verdicts. Two units beside
the player runs print one line per item, ``<unit> <item>: PASS | FAIL | NOT RUN (reason)``: ``paper_zero3``, the
paper preset's trainer path (``gpu_check_paper``), and ``one_gpu_lora``, the one-GPU preset's adapter players
(``gpu_check_lora``). The exit status is 1 when an exact-resume check or a unit's item fails. Run times and memory
on one H200: benchmarks/README.md.

    python -m benchmarks.gpu_check --device cpu --shape tiny                        # the CPU half
    python -m benchmarks.gpu_check --device cpu --shape tiny --backends paper_zero3,one_gpu_lora
    python -m benchmarks.gpu_check --device cuda --shape qwen3_4b --backends torch,paper_zero3,one_gpu_lora
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from benchmarks.gpu_check_common import (GIB, PLAYERS, SHAPE_DEFAULTS, SHAPES, Clock, build_model, count_parameters,
                                         layers_that_fit,
                                         mib, parameters_label, qwen3_config, release, render_prompts)
from benchmarks.gpu_check_lora import LoraUnit
from benchmarks.gpu_check_paper import PaperUnit
from benchmarks.gpu_check_players import SandboxRuns, run_player, run_resume

VLLM_NOTE = "vLLM: not run (its CUDA wheel is far over the 64 MiB that can be carried to the GPU machine)"
RESUME_MAX_BYTES = 12 * GIB  # a larger checkpoint: the resume check runs on the shape cut to 2 layers
UNITS = {unit.NAME: unit for unit in (PaperUnit, LoraUnit)}  # the units beside the player runs, by --backends name


class Check:
    """The settings, device, tokenizer and report of one run of the check, and what its units build from them."""

    def __init__(self, args) -> None:
        from unifiedplayers.models import build_byte_tokenizer

        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.dtype_name = args.dtype
        if args.dtype == "auto":
            self.dtype_name = "bfloat16" if self.cuda and torch.cuda.is_bf16_supported() else "float32"
        self.dtype = getattr(torch, self.dtype_name)
        self.tokenizer = build_byte_tokenizer()
        self.config = qwen3_config(args.shape, tokenizer=self.tokenizer)
        layers = (layers_that_fit(args.shape, torch.cuda.get_device_properties(self.device).total_memory)
                  if self.cuda else self.config.num_hidden_layers)
        self.player_config = qwen3_config(args.shape, layers, tokenizer=self.tokenizer)  # the player runs' model
        self.start = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.report: dict[str, Any] = {
            "device": self._device_info(), "args": vars(args), "dtype": self.dtype_name,
            "shape": {"name": args.shape, "parameters": count_parameters(self.config), **SHAPES[args.shape],
                      "player_layers": layers, "player_parameters": count_parameters(self.player_config)},
            "runs": [], "resume": {}, "sandbox": {"status": "not run", "reason": "no execution player in --players"},
            "deepspeed": {"status": "not requested"}, **{name: {"status": "not requested"} for name in UNITS},
            "vllm": {"status": "not run", "reason": VLLM_NOTE.split("(", 1)[1].rstrip(")")}}
        self.sandbox = SandboxRuns(self.report)

    def _device_info(self) -> dict:
        import transformers

        info = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "device": self.args.device, "cpu_count": os.cpu_count()}
        if self.cuda:
            props = torch.cuda.get_device_properties(self.device)
            info.update(name=props.name, total_memory_bytes=props.total_memory, cuda=torch.version.cuda,
                        capability=f"{props.major}.{props.minor}")
        return info

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def over_budget(self) -> bool:
        return bool(self.args.budget_s) and self.elapsed() > self.args.budget_s

    def save(self) -> None:
        self.report["wall_s"] = round(self.elapsed(), 2)
        self.report.update(self.summary())
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=2, default=str))
        tmp.replace(self.out / "gpu_check.json")

    def trainer_config(self, backend: str):
        from unifiedplayers.config import TrainerConfig

        a = self.args
        return TrainerConfig(backend=backend, lr=a.lr, kl_coef=a.kl_coef, micro_batch_size=a.micro_batch,
                             dtype=self.dtype_name, entropy_every=0, temperature=1.0, logprob_chunk_rows=0)

    def make_trainer(self, backend: str, role: str, config, seed: int):
        from unifiedplayers.trainer import build_trainer

        return build_trainer(self.trainer_config(backend), build_model(config, self.device, seed), role=role,
                             pad_token_id=self.tokenizer.pad_token_id)

    def engine_for(self, trainer):
        from unifiedplayers.config import RolloutConfig
        from unifiedplayers.rollout import build_rollout

        cfg = RolloutConfig(backend="hf", temperature=1.0, top_p=1.0, max_new_tokens=self.args.max_new_tokens,
                            batch_size=0)
        return build_rollout(cfg, trainer.sampling_model(self.dtype), self.tokenizer)

    def sample(self, engine, trainer, prompts: list[str], seed: int):
        engine.update_weights(trainer.sampling_model(self.dtype))
        clock = Clock(self.device)
        with clock():
            groups = engine.generate(prompts, n=self.args.samples, max_new_tokens=self.args.max_new_tokens,
                                     ignore_eos=True, seed=seed)
        return groups, clock.seconds

    @staticmethod
    def train_samples(groups) -> list:
        from unifiedplayers.trainer import sample_from_completion

        return [sample_from_completion(c, 1.0 if j % 2 == 0 else -1.0, g)
                for g, group in enumerate(groups) for j, c in enumerate(group)]

    def warm_up(self, engine) -> None:
        """One short untimed generation: kernel selection and the first-call costs stay out of tokens/s."""
        engine.generate([render_prompts(self.tokenizer, "planning", 1)[0]], n=2, max_new_tokens=4,
                        ignore_eos=True, seed=0)

    def resume_layers(self) -> int:
        if self.args.resume_layers:
            return self.args.resume_layers
        estimate = self.report["shape"]["parameters"] * 16  # fp32 weights + AdamW (8) + reference (<= 4)
        return self.config.num_hidden_layers if estimate <= RESUME_MAX_BYTES else 2

    def backend_unavailable(self, backend: str) -> Optional[str]:
        """Why ``backend`` cannot run here (peft or DeepSpeed not importable), or None."""
        name = {LoraUnit.NAME: "peft", PaperUnit.NAME: "deepspeed"}.get(backend)
        name = "deepspeed" if backend.startswith("deepspeed") else name
        if name is None:
            return None
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            return f"import {name} failed: {type(exc).__name__}: {exc}"
        if name == "deepspeed":
            self.report["deepspeed"] = {"status": "importable", "version": module.__version__}
        return None

    def guarded(self, what: str, fn: Callable[[], dict], base: dict) -> dict:
        if self.over_budget():
            return {**base, "status": "skipped", "reason": f"time budget of {self.args.budget_s} s spent"}
        print(f"{what} ...", flush=True)
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - report it and go on with the next unit
            traceback.print_exc()
            failed = {**base, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000]}
        release()  # out of the except block: the traceback's frames, and the memory they hold, are gone
        return failed

    def run_unit(self, name: str, unavailable: Optional[str]) -> None:
        """One of :data:`UNITS`; its item lines are printed as it ends."""
        unit = UNITS[name]
        if unavailable:
            result = {"status": "not run", "reason": unavailable}
        else:
            result = self.guarded(f"{name} ({unit.WHAT})", lambda: unit(self).run(), {})
        self.report[name] = result
        self.save()
        unit.print_items(result)

    def run(self) -> dict:
        a = self.args
        print(f"shape {a.shape}: {parameters_label(self.report['shape']['parameters'])} parameters, device {a.device}, "
              f"compute dtype {self.dtype_name}, backends {','.join(a.backends)}, players {','.join(a.players)}, "
              f"{a.steps} steps of {a.prompts} x {a.samples} x {a.max_new_tokens} new tokens", flush=True)
        shape = self.report["shape"]
        if shape["player_layers"] < self.config.num_hidden_layers:
            print(f"the player runs: {shape['player_layers']} of {self.config.num_hidden_layers} layers "
                  f"({parameters_label(shape['player_parameters'])} parameters), what fits this GPU's memory", flush=True)
        resume_role = "execution" if "execution" in a.players else a.players[0]
        for backend in a.backends:
            reason = self.backend_unavailable(backend)
            if backend in UNITS:
                self.run_unit(backend, reason)
                continue
            if reason:
                self.report["deepspeed"] = {"status": "not run", "reason": reason}
                self.report["runs"] += [{"backend": backend, "player": role, "status": "not run", "reason": reason}
                                        for role in a.players]
                self.report["resume"][backend] = {"status": "not run", "reason": reason}
                self.save()
                continue
            for role in a.players:
                self.report["runs"].append(self.guarded(f"{backend}/{role}", lambda: run_player(self, backend, role),
                                                        {"backend": backend, "player": role}))
                self.save()
            if a.resume:
                self.report["resume"][backend] = self.guarded(
                    f"{backend}/{resume_role} exact resume", lambda: run_resume(self, backend, resume_role),
                    {"backend": backend, "player": resume_role})
                self.save()
            if backend.startswith("deepspeed"):
                ran = [r for r in self.report["runs"] if r["backend"] == backend]
                self.report["deepspeed"]["status"] = ("ran" if all(r["status"] == "ok" for r in ran)
                                                      else "errors: see runs")
        self.sandbox.close()
        self.save()
        return self.report

    def summary(self) -> dict:
        """Totals over the runs that finished: tokens/s, the time split, peak memory, the resume verdict."""
        ok = [r for r in self.report["runs"] if r.get("status") == "ok"]
        steps = [s for r in ok for s in r["steps"]]
        ran = [v["status"] for v in self.report["resume"].values() if v["status"] in ("PASS", "FAIL")]
        return {
            "generation_tokens_per_s": tokens_per_s(steps),
            "time_split_s": time_split(steps),
            "peak_memory_bytes": max((r["peak_memory_bytes"] for r in ok), default=0),
            "peak_memory_kind": "torch.cuda.max_memory_allocated" if self.cuda else "ru_maxrss",
            "resume_check": ("PASS" if ran and all(c == "PASS" for c in ran) else "FAIL" if ran else "not run"),
            "paper_check": unit_verdict(self.report[PaperUnit.NAME]),
            "lora_check": unit_verdict(self.report[LoraUnit.NAME]),
        }


def unit_verdict(unit: dict) -> str:
    """FAIL when an item failed or the unit stopped on an error; PASS when every item that ran passed."""
    statuses = [item["status"] for item in unit.get("items", {}).values()]
    if unit.get("status") == "error" or "FAIL" in statuses:
        return "FAIL"
    return "PASS" if "PASS" in statuses else "not run"


def tokens_per_s(steps: list[dict]) -> float:
    seconds = sum(s["generation_s"] for s in steps)
    return sum(s["generated_tokens"] for s in steps) / seconds if seconds > 0 else 0.0


def time_split(steps: list[dict]) -> dict:
    return {"generation": sum(s["generation_s"] for s in steps), "sandbox": sum(s["sandbox_s"] for s in steps),
            "logprob_passes": sum(s["logprob_s"] for s in steps), "update": sum(s["update_s"] for s in steps)}


def print_runs(report: dict) -> None:
    """The player runs' table and the time split."""
    mem = "GPU GiB" if report["peak_memory_kind"].startswith("torch.cuda") else "RSS GiB"
    head = (f"{'backend':<16}{'player':<12}{'status':<8}{'gen tok/s':>10}{'gen s':>8}{'sandbox s':>10}"
            f"{'logprob s':>10}{'update s':>9}{'peak ' + mem:>14}")

    def row(label: str, tok_s: float, split: dict, peak: int) -> str:
        return (f"{label:<36}{tok_s:>10.1f}{split['generation']:>8.2f}{split['sandbox']:>10.2f}"
                f"{split['logprob_passes']:>10.2f}{split['update']:>9.2f}{peak / GIB:>14.2f}")

    print("\n" + head + "\n" + "-" * len(head))
    for r in report["runs"]:
        label = f"{r['backend']:<16}{r['player']:<12}{r['status']:<8}"
        if r.get("status") != "ok":
            print(f"{label}  {r.get('reason', '')[:90]}")
        else:
            print(row(label, tokens_per_s(r["steps"]), time_split(r["steps"]), r["peak_memory_bytes"]))
    split = report["time_split_s"]
    print("-" * len(head))
    print(row("all", report["generation_tokens_per_s"], split, report["peak_memory_bytes"]))
    print(f"\ngeneration: {report['generation_tokens_per_s']:.1f} tokens/s; time split (s): generation "
          f"{split['generation']:.2f}, sandbox {split['sandbox']:.2f}, log-prob passes {split['logprob_passes']:.2f}, "
          f"update {split['update']:.2f}; peak memory {report['peak_memory_bytes'] / GIB:.2f} GiB "
          f"({report['peak_memory_kind']})")


def print_checks(report: dict) -> None:
    """The sandbox, the exact-resume checks, DeepSpeed, vLLM and the paper unit's verdicts."""
    box = report["sandbox"]
    if box.get("status") == "ran":
        layers = {k: v for k, v in (box.get("isolation") or {}).items() if isinstance(v, bool)}
        print(f"sandbox: {box['programs']} programs (exit 0: {box['ok']}, failed: {box['failed']}, timed out: "
              f"{box['timed_out']}; random weights write no valid Python), start {box['start_s']:.2f} s, "
              f"isolation {layers}")
    else:
        print(f"sandbox: not run ({box.get('reason')})")
    for backend, r in report["resume"].items():
        if r.get("status") in ("PASS", "FAIL"):
            print(f"exact resume [{backend}/{r['player']}, {r['layers']} layers, "
                  f"{parameters_label(r['parameters'])} parameters, checkpoint {mib(r['checkpoint_bytes'])}, "
                  f"save {r['save_s']:.1f} s, load {r['load_s']:.1f} s]: {r['status']} (bitwise equal "
                  f"{r['bitwise_equal']}, max |diff| {r['max_abs_diff']:.3g}, loss {r['loss'][0]:+.6g} / "
                  f"{r['loss'][1]:+.6g}, checksum {r['checksum'][0]} / {r['checksum'][1]}, step moved weights by up "
                  f"to {r['step_changed_weights_by']:.3g})")
            if r.get("diagnosis"):
                print(f"  {r['diagnosis']} (replays: max |diff| {r['replays_max_abs_diff']:.3g})")
        else:
            print(f"exact resume [{backend}]: {r.get('status')} ({r.get('reason', '')[:200]})")
    ds = report["deepspeed"]
    print(f"DeepSpeed: {ds.get('status')}" + (f" ({ds['reason'][:200]})" if ds.get("reason") else "")
          + (f", version {ds['version']}" if ds.get("version") else ""))
    print(VLLM_NOTE)
    for name in UNITS:
        unit = report[name]
        if "items" in unit:
            counts = {s: sum(i["status"] == s for i in unit["items"].values()) for s in ("PASS", "FAIL", "NOT RUN")}
            print(f"{name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + " (the item lines above)")
        elif unit.get("status") != "not requested":
            print(f"{name}: {unit.get('status')} ({unit.get('reason', '')[:200]})")
    print(f"resume check: {report['resume_check']}; paper check: {report['paper_check']}; "
          f"one-GPU LoRA check: {report['lora_check']}; wall {report['wall_s']:.1f} s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3_4b")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per player")
    p.add_argument("--players", default=",".join(PLAYERS), help="comma-separated, of " + ",".join(PLAYERS))
    p.add_argument("--backends", default="torch",
                   help="comma-separated: torch, deepspeed_zero2, deepspeed_zero3 (a player run each), "
                        + ", ".join(f"{name} ({unit.WHAT})" for name, unit in UNITS.items()))
    p.add_argument("--dtype", choices=("bfloat16", "float32", "auto"), default="auto",
                   help="trainer.dtype (compute); auto: bfloat16 on a bf16 GPU, else float32")
    p.add_argument("--out", default="runs/gpu_check", help="folder of gpu_check.json")
    p.add_argument("--prompts", type=int, help="prompts per step (default: 4)")
    p.add_argument("--samples", type=int, help="samples per prompt, the group (default: 4)")
    p.add_argument("--max-new-tokens", type=int, help="tokens per sample (default: 128 for qwen3_4b, 24 for tiny)")
    p.add_argument("--micro-batch", type=int, help="trainer.micro_batch_size (default: 2 for qwen3_4b, 4 for tiny)")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--kl-coef", type=float, default=0.04)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: 1 for tiny, torch's own otherwise)")
    p.add_argument("--no-resume", dest="resume", action="store_false", help="skip the exact-resume check")
    p.add_argument("--resume-after", type=int, default=1, help="k: checkpoint after step k, compare step k+1")
    p.add_argument("--resume-layers", type=int, default=0,
                   help="layers of the resume check's model (0: the shape's own when its checkpoint is under "
                        f"{RESUME_MAX_BYTES // GIB} GiB, else 2)")
    p.add_argument("--ckpt-dir", help="where the resume check writes its checkpoint (default: the temp dir)")
    p.add_argument("--budget-s", type=float, default=0.0, help="skip units that would start after this (0: none)")
    args = p.parse_args(argv)
    args.players = [r for r in args.players.split(",") if r]
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = set(args.players) - set(PLAYERS)
    if unknown:
        p.error(f"unknown players {sorted(unknown)}")
    prompts, samples, new_tokens, micro = SHAPE_DEFAULTS[args.shape]
    args.prompts = args.prompts or prompts
    args.samples = args.samples or samples
    args.max_new_tokens = args.max_new_tokens or new_tokens
    args.micro_batch = args.micro_batch or micro
    if args.threads is None:  # the toy's matrices are too small for threads; on shared cores they only wait
        args.threads = 1 if args.shape == "tiny" else 0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        # Before CUDA starts: cuBLAS's deterministic workspace for the exact-resume check.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    check = Check(args)
    report = check.run()
    if report["runs"]:
        print_runs(report)
    print_checks(report)
    print(f"written: {check.out / 'gpu_check.json'}")
    return 1 if "FAIL" in (report["resume_check"], report["paper_check"], report["lora_check"]) else 0


if __name__ == "__main__":
    sys.exit(main())
