"""The printed form of a capacity plan (:mod:`unifiedplayers.capacity`): memory tables item by item (rows) and instant
by instant (columns), the disk, the compute per optimizer step and the GPU-hours of a seed."""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Optional, Sequence

from unifiedplayers.capacity.concurrent import format_together, runs_that_fit
from unifiedplayers.capacity.fits import CapacityError, check_fits
from unifiedplayers.capacity.hardware import Hardware
from unifiedplayers.capacity.memory import Instant
from unifiedplayers.capacity.run_plan import PAPER_GPU_HOURS, Plan, plan
from unifiedplayers.capacity.units import GB, TB, GiB, count

INSTANTS = ("gather: a player's weights gathered whole (its copy into vLLM after each step, the pi_ref swap); "
            "no-grad: the pi_old and pi_ref passes; step: the optimizer step; bank: the entropy bank (Appendix D.2)")

PAPER_NOTE = (f"paper: {PAPER_GPU_HOURS} local GPU-hours per seed, full UnifiedPlayers on Qwen3-4B-Base over 8 x A100 "
              "80GB (Appendix H.2 and Table 16: local GPU resource use, not elapsed wall-clock time; the CPU sandbox "
              "work is not quantified separately)")


def format_plan(plan: Plan) -> str:
    a, m = plan.arch, plan.machine
    lines = [f"Capacity plan: experiment={plan.experiment}, {plan.model}, N = {a.parameters:,} parameters "
             f"({a.source})", f"Hardware: {m.name}; {ranks_line(plan)}",
             "Rows per optimizer step (prompt + generated + tool output tokens): "
             + ", ".join(f"{r} {l.rows} x {l.prompt} + {l.response} + {l.observations}" for r, l in plan.loads.items())]
    if plan.gpu:
        peak = plan.gpu_peak
        lines += ["", *memory_table("GPU memory per GPU, GiB", plan.gpu, GiB), f"  ({INSTANTS})",
                  f"Peak per GPU: {peak.total / GiB:.1f} GiB at {peak.name}, of {m.gpu_memory / GiB:.0f} GiB."]
        if plan.vllm_kv:
            budget, one, demand = plan.vllm_kv
            lines.append(f"vLLM's KV cache: {budget / GiB:.1f} GiB after its weights and activations (one sequence "
                         f"of its full context: {one / GiB:.1f} GiB); the largest generation call on a rank needs "
                         f"{demand / GiB:.1f} GiB at its budgets" + (", so vLLM runs it in waves." if demand > budget
                                                                       else ".") + sleep_note(plan))
    host, nodes = plan.host_peak, m.nodes
    title = "Host RAM per node, GiB" if nodes == 1 else f"Host RAM per node (node 0's {plan.node_ranks} ranks), GiB"
    lines += ["", *memory_table(title, plan.host, GiB),
              f"Peak host RAM{' per node' if nodes > 1 else ''}: {host.total / GiB:.1f} GiB at {host.name}, of "
              f"{m.host_ram / GiB:.0f} GiB."]
    lines += ["", *disk_lines(plan), "", *compute_lines(plan), "", "Assumptions:"]
    lines += [f"  - {x}" for x in plan.assumptions]
    return "\n".join(lines)


def ranks_line(plan: Plan) -> str:
    """The run's ranks, and torchrun's options for them."""
    nodes, per = plan.machine.nodes, plan.node_ranks
    if not plan.on_gpu:
        return (f"a CPU run, {per} process{'es' if per > 1 else ''}" + (f" on each of {nodes} nodes" if nodes > 1
                                                                        else "") + " (the GPU figures do not apply)")
    if nodes == 1:
        return f"{plan.world} ranks (torchrun --nproc_per_node={plan.world})"
    return f"{plan.world} ranks, {per} on each of {nodes} nodes (torchrun --nnodes={nodes} --nproc_per_node={per})"


def memory_table(title: str, instants: Sequence[Instant], unit: float) -> list[str]:
    """Items as rows, instants as columns (blank where an item is absent), the settings that change each item."""
    settings: dict[str, str] = {}
    for inst in instants:
        for item in inst.items:
            settings.setdefault(item.name, item.setting)
    names = list(settings)
    width = max(len(n) + 2 for n in names + [title])
    heads = [i.name.split(" (")[0] for i in instants]
    cols = [max(8, len(h)) for h in heads]
    out = [f"{title:<{width}}  " + "  ".join(f"{h:>{c}}" for h, c in zip(heads, cols)) + "  setting"]
    for name in names:
        cells = []
        for inst, c in zip(instants, cols):
            value = sum(i.bytes for i in inst.items if i.name == name)
            cells.append(f"{value / unit:>{c}.2f}" if any(i.name == name for i in inst.items) else " " * c)
        out.append(f"  {name:<{width - 2}}  " + "  ".join(cells) + f"  {settings[name]}")
    out.append(f"  {'total':<{width - 2}}  " + "  ".join(f"{i.total / unit:>{c}.2f}" for i, c in zip(instants, cols)))
    roles = [f"{h}: {i.name.split(' (')[1][:-1]}" for h, i in zip(heads, instants) if " (" in i.name]
    if roles:
        out.append(f"  (the player whose micro-batch is largest at each pass: {', '.join(roles)})")
    return out


def disk_lines(plan: Plan) -> list[str]:
    full = sum(i.bytes for i in plan.checkpoint)
    out = [f"Disk: one checkpoint of a trained player {_size(full)} = "
           + " + ".join(f"{i.name} {_size(i.bytes)}" for i in plan.checkpoint)]
    out += [f"  {i.name}: {_size(i.bytes)}  ({i.setting})" for i in plan.disk]
    if plan.parked is None:
        return out
    p, m = plan.parked, plan.machine
    out.append(f"  {p.name}: {_size(p.bytes)}  ({p.setting})")
    if m.nodes == 1:
        out.append(f"  per run, both on one disk: {_size(plan.run_disk + p.bytes)}, of {_size(m.disk)}")
    elif m.offload_disk is None:
        out.append(f"  the run directory, shared by the {m.nodes} nodes, with every node's parked state there: "
                   f"{_size(plan.run_disk + plan.parked_on_run_disk(m).bytes)}, of {_size(m.disk)}")
    else:
        out.append(f"  each node's trainer.offload_dir: {_size(p.bytes)}, of {_size(m.offload_disk)}; the run "
                   f"directory, shared by the {m.nodes} nodes: {_size(plan.run_disk)}, of {_size(m.disk)}")
    return out


def compute_lines(plan: Plan) -> list[str]:
    """Per optimizer step of each player, then the run and its GPU-hours."""
    roles = list(plan.roles)
    if not roles:
        return ["Compute: no trained player."]
    rows = [("updates in the run", lambda r: f"{plan.updates[r]:,}"),
            ("tokens generated", lambda r: count(plan.roles[r].generated)),
            ("tokens trained (in the loss)", lambda r: count(plan.roles[r].trained)),
            ("sandbox calls (tools, re-runs, checks)", lambda r: count(plan.roles[r].sandbox_calls)),
            ("FLOPs: generation", lambda r: f"{plan.roles[r].generation_flops:.2e}"),
            (f"FLOPs: training ({2 if plan.adapter else 3} x forward)",
             lambda r: f"{plan.roles[r].training_flops:.2e}"),
            ("FLOPs: pi_old, pi_ref, entropy bank", lambda r: f"{plan.roles[r].no_grad_flops:.2e}")]
    for stage in plan.roles[roles[0]].seconds:
        rows.append((f"wall s: {stage}", lambda r, st=stage: f"{plan.roles[r].seconds[st]:.1f}"))
    out = [f"{'Compute per optimizer step':<40}" + "".join(f"{r:>12}" for r in roles)]
    out += [f"  {name:<38}" + "".join(f"{cell(r):>12}" for r in roles) for name, cell in rows]
    tokens = sum(plan.updates[r] * plan.roles[r].generated for r in roles)
    calls = sum(plan.updates[r] * plan.roles[r].sandbox_calls for r in roles)
    out.append(f"Run: {count(tokens)} tokens generated, {count(calls)} sandbox calls, {plan.total_flops:.2e} FLOPs.")
    if plan.gpu_hours is None:
        out.append("GPU-hours: none (a CPU run).")
        return out
    stages = plan.roles[roles[0]].seconds
    by_stage = {st: sum(plan.updates[r] * plan.roles[r].seconds[st] for r in roles) for st in stages}
    by_stage["diagnostic pool"] = plan.pool_seconds
    wall = plan.wall_seconds
    split = ", ".join(f"{st} {s / wall:.0%}" for st, s in sorted(by_stage.items(), key=lambda x: -x[1]))
    out.append(f"GPU-hours per seed: {plan.gpu_hours:.0f} ({wall / 3600:.1f} h wall x {plan.world} GPUs at "
               f"{plan.machine.utilisation:.0%} MFU, decoding at {plan.machine.decode_efficiency:.0%} of HBM "
               f"bandwidth); wall by stage: {split}.")
    for what, seconds in plan.omitted:
        out.append(f"  not in it: {what}: {'saves ' if seconds < 0 else ''}~{abs(seconds) / 3600:.2f} h wall, "
                   f"{abs(seconds) * plan.world / 3600:.1f} GPU-hours")
    out.append(f"  {PAPER_NOTE}; this plan: {plan.gpu_hours / PAPER_GPU_HOURS:.2f} x that." if
               plan.model.lower().startswith("qwen3-4b") else
               f"  {PAPER_NOTE}; the paper gives no figure for {plan.model}.")
    return out


def _size(x: float) -> str:
    """Disk sizes in decimal units, as disks are sold."""
    for unit, name in ((TB, "TB"), (GB, "GB"), (1e6, "MB")):
        if x >= unit:
            return f"{x / unit:.2f} {name}"
    return f"{x / 1e3:.0f} kB"


# --------------------------------------------------------------------------- command line
def parse_args(argv: Sequence[str]) -> tuple[Hardware, list[str]]:
    """(the machine of the ``--options``, the Hydra overrides)."""
    import argparse

    d = Hardware()
    parser = argparse.ArgumentParser(
        prog="python -m unifiedplayers.capacity",
        description="The capacity and compute plan of a run: python -m unifiedplayers.capacity experiment=NAME "
                    "[Hydra overrides] [options]. Defaults: the paper's node, 8 x A100 80GB. Runs started together "
                    "on one node: --runs N or --members FILE (python -m unifiedplayers.capacity --help-together).")
    parser.add_argument("--gpus", type=int, default=d.gpus,
                        help="GPUs of a node, one rank each (torchrun --nproc_per_node)")
    parser.add_argument("--nodes", type=int, default=d.nodes, help="nodes of the run, alike (torchrun --nnodes)")
    parser.add_argument("--gpu-memory-gb", type=float, default=d.gpu_memory / GiB, help="per GPU, GiB (80GB A100: 80)")
    parser.add_argument("--host-ram-gb", type=float, default=d.host_ram / GiB, help="per node, GiB")
    parser.add_argument("--disk-tb", type=float, default=d.disk / TB,
                        help="free at the run directory (shared by the nodes), TB")
    parser.add_argument("--offload-disk-tb", type=float, default=None,
                        help="free in trainer.offload_dir, per node, when not the run directory's file system, TB")
    parser.add_argument("--utilisation", type=float, default=d.utilisation, help="MFU of training and prefill")
    parser.add_argument("--decode-efficiency", type=float, default=d.decode_efficiency,
                        help="share of the GPU's memory bandwidth decoding reaches")
    parser.add_argument("--gpu-tflops", type=float, default=d.gpu_flops / 1e12, help="dense bf16 peak per GPU")
    parser.add_argument("--gpu-bandwidth-tbs", type=float, default=d.gpu_bandwidth / 1e12, help="HBM TB/s per GPU")
    args, overrides = parser.parse_known_args(list(argv))
    unknown = [o for o in overrides if o.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    name = (f"{args.gpus} x {args.gpu_memory_gb:g} GiB GPU, {args.host_ram_gb:g} GiB RAM, {args.disk_tb:g} TB disk"
            + (" (the paper's node)" if args.gpus == 8 and args.gpu_memory_gb == 80 else ""))
    if args.nodes > 1:
        name = (f"{args.nodes} nodes of {args.gpus} x {args.gpu_memory_gb:g} GiB GPU and {args.host_ram_gb:g} GiB RAM "
                f"each, {args.disk_tb:g} TB disk shared")
    if args.offload_disk_tb is not None:
        name += f", {args.offload_disk_tb:g} TB in trainer.offload_dir"
    machine = Hardware(gpus=args.gpus, nodes=args.nodes, gpu_memory=args.gpu_memory_gb * GiB,
                      host_ram=args.host_ram_gb * GiB, disk=args.disk_tb * TB,
                      offload_disk=None if args.offload_disk_tb is None else args.offload_disk_tb * TB,
                      utilisation=args.utilisation, decode_efficiency=args.decode_efficiency,
                      gpu_flops=args.gpu_tflops * 1e12, gpu_bandwidth=args.gpu_bandwidth_tbs * 1e12, name=name)
    return machine, overrides


TOGETHER_HELP = """Runs started together on one node, each its own run (experiments/dp8_single_gpu_runs.sh):
  --runs N       N runs of the config the overrides give
  --members F    one run a line of file F (-: standard input): a label (its run directory), then its Hydra
                 overrides, shell words, as `python -m ablations.sweeps ... --list-members` prints them; the
                 overrides on the command line are added to each. Standard output: the lines of the runs that fit,
                 in order; the table goes to standard error.
  --here         the node this command runs on (host RAM available, free disk at the runs' directories), not the
                 machine of the options; the machine options still say each run's GPUs (--gpus)
The sum of their host RAM peaks and disks is checked against the node: exit 0 when all fit, 1 when only the first
few do (the table says how many), 2 on a config error."""


def parse_together(argv: Sequence[str]) -> tuple[Any, list[str]]:
    """(the ``--runs``, ``--members``, ``--here`` options, the rest for :func:`parse_args`)."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--runs", type=int, default=0)
    parser.add_argument("--members", default=None)
    parser.add_argument("--here", action="store_true")
    parser.add_argument("--help-together", action="store_true")
    return parser.parse_known_args(list(argv))


def main(argv: Optional[Sequence[str]] = None) -> int:
    from unifiedplayers import config

    together, rest = parse_together(sys.argv[1:] if argv is None else argv)
    if together.help_together:
        print(TOGETHER_HELP)
        return 0
    machine, overrides = parse_args(rest)
    if together.runs or together.members is not None:
        return main_together(together, machine, overrides)
    try:
        cfg = config.compose(overrides)
        preset = [str(o) for o in (cfg.get("capacity") or {}).get("machine") or []]
        if preset:  # the preset's machine (capacity.machine), then the command line's options over it
            machine, _ = parse_args([*preset, *rest])
        the_plan = plan(cfg, machine)
    except ValueError as err:
        print(f"unifiedplayers.capacity: {err}", file=sys.stderr)
        return 2
    print(format_plan(the_plan))
    try:
        check_fits(the_plan, machine)
    except CapacityError as err:
        print(f"\n{err}")
        return 1
    return 0


def main_together(together: Any, machine: Hardware, overrides: list[str]) -> int:
    """``--runs N`` or ``--members F``: the runs' plans summed against one node (:mod:`.concurrent`)."""
    import shlex

    from unifiedplayers import config
    from unifiedplayers.capacity.hardware import node_here

    lines: list[str] = []
    same = together.members is None  # --runs: N copies of one config, planned once
    try:
        if same:
            runs = [(f"run {i + 1}", list(overrides)) for i in range(together.runs)]
        else:
            with (sys.stdin if together.members == "-" else open(together.members)) as f:
                lines = [line.rstrip("\n") for line in f if line.strip()]
            runs = [(words[0], words[1:] + overrides) for words in map(shlex.split, lines)]
        cfgs = [config.compose(o) for _, o in (runs[:1] if same else runs)]
        if not cfgs:
            print("unifiedplayers.capacity: no runs to plan", file=sys.stderr)
            return 0
        if together.here:
            machine = replace(node_here(cfgs), gpus=machine.gpus, nodes=1)
        plans = [plan(c, machine) for c in cfgs] * (len(runs) if same else 1)
    except (OSError, ValueError) as err:
        print(f"unifiedplayers.capacity: {err}", file=sys.stderr)
        return 2
    fit = runs_that_fit(plans, machine)
    print(format_together([label for label, _ in runs], plans, machine), file=sys.stdout if same else sys.stderr)
    for line in lines[:fit]:
        print(line)
    return 0 if fit == len(runs) else 1


def sleep_note(plan) -> str:
    """Whether vLLM's budget is in every instant or only in generation (``rollout.sleep_level``)."""
    level = int(plan.sleep)
    if not level:
        return " vLLM does not sleep while the trainer runs (rollout.sleep_level=0): its budget is in every instant."
    return (f" vLLM sleeps through the trainer's passes (rollout.sleep_level={level}, not yet run on a GPU): its budget "
            "is in the generation instant only" + (", its weights on the host meanwhile." if level == 1 else "."))
