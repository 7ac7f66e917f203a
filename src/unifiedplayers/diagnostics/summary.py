"""The end-of-run summary, rebuilt from the run directory alone: ``summary.json``, ``summary.md`` (the text printed)
and ``summary.png`` (:func:`write_summary_png`, the diagnostics of Appendix D.2 per update).
"""
from __future__ import annotations

import contextlib
import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np
from omegaconf import OmegaConf

from unifiedplayers.diagnostics.execution_pool import pool_summary
from unifiedplayers.feedback.perturbation import RULES
from unifiedplayers.diagnostics.records import iter_records
from unifiedplayers.diagnostics.verifier_kinds import iteration_kinds, kinds_lines
from unifiedplayers.feedback.trajectory import render
from unifiedplayers.machine import machine_line
from unifiedplayers.roles import ROLES
from unifiedplayers.sandbox.isolation import isolation_line
from unifiedplayers import rundir


def _fmt(x: Any) -> str:
    return "  -  " if x is None else f"{x:+.3f}"


def _clip(text: str, n: int) -> str:
    text = text.strip()
    return text if len(text) <= n else text[:n] + f" [... {len(text) - n} more characters]"


def pick_sample(records: list) -> Optional[Any]:
    """The most informative played task: valid verifiers and an answered trajectory, latest first."""
    played = [r for r in records if r.trajectories]
    if not played:
        return None
    return max(reversed(played), key=lambda r: (r.z_orig.shape[0] > 0, any(t.final_answer for t in r.trajectories),
                                                bool(r.z_orig.any())))


def verdict_table(record: Any) -> str:
    """Z(q) as text: one row per valid verifier, one column group per trajectory (orig + P variants)."""
    m_q, k, p = record.z_adv.shape
    if m_q == 0:
        return "(no valid verifier: the verdict matrix has no rows)"
    head = ["verifier"]
    for kk in range(k):
        head.append(f"t{kk}:orig")
        head.extend(f"t{kk}:{RULES[r].abbrev if r in RULES else r}" for r in record.rules)
    rows = []
    cell = lambda z, err: "e" if err else str(int(z))  # noqa: E731
    for i in range(m_q):
        row = [f"v{record.valid[i]}"]
        for kk in range(k):
            row.append(cell(record.z_orig[i, kk], record.error_orig[i, kk]))
            row.extend(cell(record.z_adv[i, kk, j], record.error_adv[i, kk, j]) if record.adv_mask[kk, j] else "."
                       for j in range(p))
        rows.append(row)
    widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head] + rows]
    return "\n".join(lines) + "\n(1 accept, 0 reject, e check error: no verdict, 0 in Z; . rule could not apply)"


def build_summary(run_dir: Path, timing: Optional[dict] = None) -> tuple[dict[str, Any], Optional[Any]]:
    run_dir = Path(run_dir)
    metrics = rundir.read_jsonl(run_dir / rundir.METRICS, missing_ok=True)
    records = list(iter_records(run_dir / rundir.RECORDS)) if (run_dir / rundir.RECORDS).exists() else []
    rewards = {r: [m.get(f"{r}/reward_mean") for m in metrics] for r in ROLES}
    trained = {r: [m.get(f"{r}/reward_mean") for m in metrics if m.get("block") == r] for r in ROLES}
    totals = {k: float(sum(m.get(f"timing/{k}", 0.0) or 0.0 for m in metrics))
              for k in ("generation_s", "sandbox_s", "update_s", "total_s")}
    statuses = dict(Counter(r.meta.get("status", "?") for r in records))
    cfg = OmegaConf.load(run_dir / rundir.CONFIG) if (run_dir / rundir.CONFIG).exists() else None
    summary = {
        "run_dir": str(run_dir),
        "updates": len(metrics),
        "records": len(records),
        "record_status": statuses,
        "reward_mean_per_update": rewards,
        "reward_mean_in_own_block": trained,
        "timing_from_metrics": totals,
        "timing": timing,
        "last": dict(metrics[-1]) if metrics else {},
        "execution_pool": pool_summary(metrics, run_dir),
        "precision": precision_summary(metrics, cfg),
        "machine": machine_summary(cfg),
        "verifier_kinds": iteration_kinds(records),
        "pad_share": pad_shares(metrics),
    }
    return summary, pick_sample(records)


def _per_role(metrics: list[dict[str, Any]], name: str) -> dict[str, list[float]]:
    """The values of ``<role>/<name>`` over the metrics lines, per role that logged any."""
    out = {role: [m[f"{role}/{name}"] for m in metrics if m.get(f"{role}/{name}") is not None] for role in ROLES}
    return {role: values for role, values in out.items() if values}


def pad_shares(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Each trained player's padded positions / positions processed by its updates' micro-batches, the mean over its
    updates (``<role>/pad_share``; ``trainer.max_tokens_per_micro_batch`` lowers it)."""
    return {role: float(sum(values) / len(values)) for role, values in _per_role(metrics, "pad_share").items()}


def machine_summary(cfg: Optional[Any]) -> list[dict[str, Any]]:
    """Where each start of the run ran and its sandbox isolation (``config.yaml``'s ``machine``, written by
    :func:`unifiedplayers.machine.record_start`); empty for a run without it."""
    starts = OmegaConf.select(cfg, "machine", default=None) if cfg is not None else None
    return list(OmegaConf.to_container(starts)) if OmegaConf.is_list(starts) else []


def precision_summary(metrics: list[dict[str, Any]], cfg: Optional[Any]) -> dict[str, Any]:
    """The run's dtypes (``config.yaml``: as ``auto`` resolved at its start, and why) and, per player, the
    train/rollout log-prob mismatch: mean |log π_train − log π_behaviour| at each phase's on-policy step (at every
    step when π_old is recomputed)."""
    out: dict[str, Any] = {}
    if cfg is not None:
        out.update({"model.dtype": OmegaConf.select(cfg, "model.dtype"),
                    "trainer.dtype": OmegaConf.select(cfg, "trainer.dtype"),
                    "reason": OmegaConf.select(cfg, "precision_reason")})
    out["logprob_mismatch"] = {role: {"mean": float(np.mean(v)), "max": float(np.max(v)), "steps": len(v)}
                               for role, v in _per_role(metrics, "logprob_mismatch").items()}
    return out


def machine_lines(starts: list[dict[str, Any]]) -> list[str]:
    """Two lines per start of the run: its machine and its sandbox's isolation layers."""
    out = []
    for start in starts:
        where = f" (from update {start.get('from_update')})" if len(starts) > 1 else ""
        out.append(f"machine{where}: {machine_line(start)}")
        if start.get("sandbox_isolation") is not None:
            out.append(f"sandbox isolation{where}: {isolation_line(start['sandbox_isolation'])}")
    return out


def render_summary(summary: dict[str, Any], sample: Optional[Any]) -> str:
    out = [f"# UnifiedPlayers run summary ({summary['run_dir']})", "",
           f"{summary['updates']} updates, {summary['records']} interaction records {summary['record_status']}", ""]
    out.append("## Mean reward per update (all players, every update; * = the player trained in that update)")
    n = summary["updates"]
    blocks = summary.get("blocks") or []
    out.append("update     " + " ".join(f"{u:>7d}" for u in range(n)))
    for role in ROLES:
        vals = summary["reward_mean_per_update"][role]
        cells = [(_fmt(v) + ("*" if i < len(blocks) and blocks[i] == role else " ")).rjust(7) for i, v in enumerate(vals)]
        out.append(f"{role:<10} " + " ".join(cells))
    out.append("")
    t = summary["timing_from_metrics"]
    out.append(f"time in updates: generation {t['generation_s']:.1f} s, sandbox {t['sandbox_s']:.1f} s, "
               f"GRPO updates {t['update_s']:.1f} s (total {t['total_s']:.1f} s)")
    if summary.get("pad_share"):
        out.append("padding in the updates' micro-batches (padded / processed positions, mean over updates): "
                   + ", ".join(f"{role} {100 * v:.1f} %" for role, v in summary["pad_share"].items()))
    if summary.get("timing") and summary["timing"].get("model_load_s"):
        out.append(f"model load {summary['timing']['model_load_s']:.1f} s; checkpoints and state "
                   f"{summary['timing'].get('checkpoint_s', 0.0):.1f} s")
    prec = summary.get("precision") or {}
    if prec.get("model.dtype"):
        out.append(f"precision: model.dtype {prec['model.dtype']} (rollouts), trainer.dtype {prec['trainer.dtype']}"
                   + (f" ({prec['reason']})" if prec.get("reason") else ""))
    out.extend(machine_lines(summary.get("machine") or []))
    if prec.get("logprob_mismatch"):
        out.append("train/rollout log-prob mismatch, mean |log π_train − log π_behaviour| (each phase's on-policy "
                   "step, or every step with π_old recomputed): "
                   + ", ".join(f"{role} {v['mean']:.2e} (max {v['max']:.2e}, {v['steps']} steps)"
                               for role, v in prec["logprob_mismatch"].items()))
    out.append("")
    out.extend(kinds_lines(summary.get("verifier_kinds") or {}))
    pool = summary.get("execution_pool")
    if pool:
        out.append("## Execution accuracy on the fixed diagnostic pool (§4.4, Appendix D.2)")
        pct = lambda x: "  -  " if x is None else f"{100 * x:5.1f}"  # noqa: E731
        out.append("execution update " + " ".join(f"{s:>6d}" for s in pool["steps"]))
        for name in ("accuracy", "accuracy_math", "accuracy_general"):
            out.append(f"{name:<16} " + " ".join(pct(x).rjust(6) for x in pool[name]))
        rate, drop = pool["negative_step_rate"], pool["max_drop_points"]
        out.append("negative-step rate " + ("-" if rate is None else f"{rate:.2f}") + ", maximum drop "
                   + ("-" if drop is None else f"{drop:.1f} points"))
        out.extend(f"[missing] {m}" for m in pool["missing"])
        out.append("")
    if sample is None:
        out.append("(no well-formed task was played)")
        return "\n".join(out)
    out += ["## A sample task", "", _clip(sample.question, 600), "",
            f"expected answer (Planning's, never shown to the others): {sample.expected_answer}",
            f"checkpoints: " + ", ".join(f"{v['player']}@it{v['outer_iteration']}/step{v['step']}"
                                        for v in sample.meta.get("checkpoints", {}).values()), ""]
    k_best = max(range(len(sample.trajectories)),
                 key=lambda k: (sample.trajectories[k].final_answer is not None, len(sample.trajectories[k].steps)))
    traj = sample.trajectories[k_best]
    status = sample.meta.get("trajectory_status", ["?"] * len(sample.trajectories))[k_best]
    r_s = sample.rewards.get("execution", [None] * len(sample.trajectories))[k_best]
    r_s = "?" if r_s is None else f"{r_s:.3f}"
    out += [f"## Trajectory t{k_best} (status {status}, final answer {traj.final_answer!r}, r_S = {r_s})", "",
            _clip(render(traj), 1500), ""]
    if sample.verifiers:
        r_c = sample.rewards.get("evaluation", [])
        i = sample.valid[0]
        r = f"{r_c[i]:.3f}" if i < len(r_c) else "?"
        out += [f"## Verifier v{i} (valid; r_C = {r})", "", _clip(sample.verifiers[0], 1500), ""]
    else:
        bad = sample.meta.get("verifier_outputs", [""])
        why = sample.meta.get("verifier_validity", ["?"])
        out += ["## Verifier v0 (invalid: " + str(why[0] if why else "?") + ")", "", _clip(bad[0] if bad else "", 800), ""]
    out += ["## Verdict matrix Z(q) = [Z_orig | Z_adv] of this task", "", verdict_table(sample), ""]
    rw = sample.rewards
    num = lambda x: "?" if x is None else f"{x:.3f}"  # noqa: E731
    out.append(f"U = {num(rw.get('U'))}, V = {num(rw.get('V'))}, R = {num(rw.get('R'))}, r_T = {num(rw.get('planning'))}")
    return "\n".join(out)


def write_summary(run_dir: Path, timing: Optional[dict] = None, png: bool = True) -> tuple[dict[str, Any], str]:
    """Write ``summary.json``, ``summary.md`` and (``png``) ``summary.png``; return the summary and its text."""
    run_dir = Path(run_dir)
    summary, sample = build_summary(run_dir, timing)
    metrics = rundir.read_jsonl(run_dir / rundir.METRICS, missing_ok=True)
    summary["blocks"] = [m.get("block") for m in metrics]
    text = render_summary(summary, sample)
    tmp = run_dir / f".{rundir.SUMMARY_JSON}.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o)))
    tmp.replace(run_dir / rundir.SUMMARY_JSON)
    (run_dir / rundir.SUMMARY_MD).write_text(text + "\n")
    try:
        if png:
            write_summary_png(run_dir, metrics)
    except Exception as exc:  # a plot must never fail a finished run; the text summary is written already
        warnings.warn(f"summary.png not written: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
    return summary, text


# Panels of summary.png: (title, metrics key suffix after "<role>/").
PLOT_PANELS = (("mean reward", "reward_mean"), ("clip fraction", "clip_frac"), ("KL to the reference", "kl"),
               ("grad-norm (before clipping)", "grad_norm"))
PROBE_KEYS = ("planning/U", "planning/well_formed", "execution/accuracy", "execution/answered",
              "evaluation/valid", "evaluation/adv_rejection", "evaluation/discrimination")


def metric_series(metrics: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(update indices, values) of the metrics lines that hold a finite number under ``key``; the index is
    ``global_update`` when logged, else the line number."""
    xs, ys = [], []
    for n, m in enumerate(metrics):
        v = m.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v):
            xs.append(int(m.get("global_update", n)))
            ys.append(float(v))
    return xs, ys


def probe_results(run_dir: Path) -> dict[int, dict[str, Any]]:
    """``{outer iteration: metrics}`` of the held-out probes in ``run_dir/probes/`` (iteration 0: the backbone):
    ``iter<i>.json`` and the per-role ``iter<i>.<role>.json`` merged; unreadable files are skipped."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(Path(run_dir).glob(f"{rundir.PROBES}/iter*.json")):
        with contextlib.suppress(ValueError, KeyError, OSError, TypeError):
            it = int(path.name.split(".")[0][4:])
            out.setdefault(it, {}).update(json.loads(path.read_text())["metrics"])
    return dict(sorted(out.items()))


def write_summary_png(run_dir: Path, metrics: Optional[list[dict[str, Any]]] = None) -> Optional[Path]:
    """``summary.png``: one panel per :data:`PLOT_PANELS` entry (a line per player), plus the diagnostic pool's
    accuracy per update and the probes (``eval/probes``) per outer iteration where the run has them. ``None``
    (nothing written) when there is no metrics line."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    if metrics is None:
        metrics = rundir.read_jsonl(run_dir / rundir.METRICS, missing_ok=True)
    if not metrics:
        return None
    pool = metric_series(metrics, "execution/pool_accuracy")
    probes = probe_results(run_dir)
    extra = [p for p in (("pool", pool) if pool[0] else None, ("probes", probes) if probes else None) if p]
    n = len(PLOT_PANELS) + len(extra)
    cols = 3 if n > 4 else 2
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    flat = list(axes.ravel())
    for ax, (title, suffix) in zip(flat, PLOT_PANELS):
        for c, role in enumerate(ROLES):
            xs, ys = metric_series(metrics, f"{role}/{suffix}")
            if xs:
                # One line per run of consecutive updates (a block): no line across the other players' blocks.
                breaks = [0] + [i for i in range(1, len(xs)) if xs[i] != xs[i - 1] + 1] + [len(xs)]
                for j, (a, b) in enumerate(zip(breaks, breaks[1:])):
                    ax.plot(xs[a:b], ys[a:b], "o-" if len(xs) < 40 else "-", ms=3, lw=1, color=f"C{c}",
                            label=role if j == 0 else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:  # e.g. the KL panel of a run without a KL term (β = 0)
            ax.text(0.5, 0.5, f"no {suffix} in this run's metrics", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="0.4")
    for ax, (kind, data) in zip(flat[len(PLOT_PANELS):], extra):
        if kind == "pool":
            ax.plot(data[0], [100 * y for y in data[1]], "o-", ms=3, color="C1")
            ax.set_title("Execution accuracy on the diagnostic pool (%)", fontsize=10)
            ax.set_xlabel("update")
        else:
            its = list(data)
            for c, key in enumerate(PROBE_KEYS):
                pts = [(i, data[i].get(key)) for i in its if isinstance(data[i].get(key), (int, float))]
                if pts:
                    ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o-", ms=3, color=f"C{c}",
                            label=key + (" (x100)" if key == "planning/U" else " (%)"))
            ax.set_title("held-out probes (eval/probes)", fontsize=10)
            ax.set_xlabel("outer iteration (0 = backbone)")
            ax.set_xticks(its)
            ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    for ax in flat[n:]:
        ax.axis("off")
    fig.suptitle(f"UnifiedPlayers run {run_dir.name}: {len(metrics)} updates", fontsize=11)
    fig.tight_layout()
    path = run_dir / rundir.SUMMARY_PNG
    tmp = run_dir / f".{rundir.SUMMARY_PNG}.tmp"
    fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    tmp.replace(path)
    return path
