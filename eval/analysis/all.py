"""Run every analysis that the run directory has the data for: ``python -m eval.analysis.all RUN_DIR``."""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

from eval.analysis import compute, curves, diagnostics, discrimination, reward_variance, verifier_kinds
from eval.analysis.rundir import load_run, write_outputs


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    args = ap.parse_args(argv)
    run = load_run(args.run_dir)
    done = {}
    if run.played_records():
        for mod, name in ((discrimination, "discrimination"), (reward_variance, "reward_variance"),
                          (verifier_kinds, "verifier_kinds")):
            result = mod.analyse(run)
            out = write_outputs(run, name, result, mod.to_markdown(result))
            done[name] = result
        if done["reward_variance"]["num_used"]:
            reward_variance.plot(done["reward_variance"], out / "reward_variance.png")
    if run.metrics or run.records:
        result = curves.analyse(run)
        out = write_outputs(run, "curves", result, curves.to_markdown(result))
        curves.plot(result, out / "curves.png")
        done["curves"] = result
    if run.metrics:
        row = diagnostics.diagnostics(run)
        write_outputs(run, "diagnostics_execution", {"rows": [row]}, diagnostics.to_markdown([row]))
        done["diagnostics"] = row
        result = compute.analyse(run)
        write_outputs(run, "compute", result, compute.to_markdown(result))
        done["compute"] = result
    print(f"[analysis] {run.path}: wrote {', '.join(done) or 'nothing (no records or metrics)'} under {run.path / 'analysis'}")
    return done


if __name__ == "__main__":
    main()
