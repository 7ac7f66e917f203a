"""Exporting a trained player in the Hugging Face format (``unifiedplayers.export``): a tiny run's
players, written with ``save_pretrained`` by the CLI and at the end of the run, load with
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` and give the trained weights' logits."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from unifiedplayers import precision
from unifiedplayers.config import compose
from unifiedplayers.export import EXPORT_META, export_dtype, main
from unifiedplayers.rundir import EXPORT
from unifiedplayers.loop.outer import OuterLoop
from unifiedplayers.models import cast_parameters, load_model
from unifiedplayers.roles import ROLES

pytestmark = pytest.mark.cpu

TEXT = "<|im_start|>user\nTom has 3 apples and buys 4 more.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished tiny run: one update of each player, exported at its end (on by default; the tiny preset's off)."""
    d = tmp_path_factory.mktemp("export") / "run"
    OuterLoop(compose(["experiment=tiny", "schedule.export_at_end=true"]), d).run()
    return d


@pytest.fixture(scope="module")
def frozen_evaluation_run(tmp_path_factory) -> Path:
    """A finished tiny run that trains Planning and Execution only, with the end-of-run export off."""
    d = tmp_path_factory.mktemp("export") / "run"
    OuterLoop(compose(["experiment=tiny", "schedule.train_evaluation=false", "schedule.export_at_end=false"]), d).run()
    return d


def trained(run_dir: Path, role: str):
    """(the run's backbone with ``role``'s model.pt loaded, in float32; the untrained backbone; tokenizer)."""
    model_cfg = OmegaConf.load(run_dir / "config.yaml").model
    model, tokenizer = load_model(model_cfg)
    backbone, _ = load_model(model_cfg)
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "iter1" / role / "model.pt", weights_only=True))
    return model, backbone, tokenizer


@torch.no_grad()
def logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits.float()


def test_float32_export_gives_the_trained_weights_logits_exactly(run_dir, tmp_path):
    out = tmp_path / "execution"
    assert main([str(run_dir), "--role", "execution", "--out", str(out), "--dtype", "float32"]) == [out]
    model, backbone, tokenizer = trained(run_dir, "execution")
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert (out / "model.safetensors").is_file() and exported.dtype == torch.float32
    assert torch.equal(logits(exported, ids), logits(model, ids))
    saved = torch.load(run_dir / "checkpoints" / "iter1" / "execution" / "model.pt", weights_only=True)
    assert all(torch.equal(p, saved[n]) for n, p in exported.state_dict().items())
    # The trained weights, not the start: the tiny run's one update moves them little (its random model's groups
    # have equal rewards, so mostly weight decay), but it moves every matrix.
    start = dict(backbone.named_parameters())
    assert all(not torch.equal(p, start[n]) for n, p in exported.named_parameters() if p.ndim == 2)
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded(TEXT).input_ids == tokenizer(TEXT).input_ids
    assert reloaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == \
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_bfloat16_export_keeps_rotary_buffers_float32_and_is_close(run_dir, tmp_path):
    out = tmp_path / "planning"
    main([str(run_dir), "--role", "planning", "--out", str(out), "--dtype", "bfloat16"])
    model, _, tokenizer = trained(run_dir, "planning")
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert all(p.dtype == torch.bfloat16 for p in exported.parameters())
    assert all(b.dtype == torch.float32 for n, b in exported.named_buffers() if n.endswith("inv_freq"))
    full = logits(model, ids)
    assert torch.equal(logits(exported, ids), logits(cast_parameters(model, torch.bfloat16), ids))
    diff = (logits(exported, ids) - full).abs().max().item()
    assert 0 < diff < 0.05 * full.abs().max().item()
    assert json.loads((out / EXPORT_META).read_text())["dtype"] == "bfloat16"


def test_the_end_of_run_export_holds_every_trained_player(run_dir):
    for role in ROLES:
        out = run_dir / EXPORT / role
        meta = json.loads((out / EXPORT_META).read_text())
        assert meta["role"] == role
        assert meta["source_checkpoint"] == str((run_dir / "checkpoints" / "iter1" / role).resolve())
        assert (meta["outer_iteration"], meta["global_step"], meta["run_updates_completed"]) == (1, 1, 3)
        assert meta["dtype"] == "float32" and meta["run_finished"] and meta["model"] == "tiny-random-llama"
        model, _, tokenizer = trained(run_dir, role)
        ids = tokenizer(TEXT, return_tensors="pt").input_ids
        assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(out), ids), logits(model, ids))


def test_export_at_end_false_writes_none_and_all_exports_the_trained_players_only(frozen_evaluation_run, tmp_path):
    run_dir = frozen_evaluation_run
    assert not (run_dir / EXPORT).exists()
    out = tmp_path / "all"
    assert main([str(run_dir), "--role", "all", "--out", str(out)]) == [out / "planning", out / "execution"]
    assert sorted(p.name for p in out.iterdir()) == ["execution", "planning"]
    with pytest.raises(SystemExit, match="no checkpoint of the evaluation player.*planning, execution"):
        main([str(run_dir), "--role", "evaluation", "--out", str(tmp_path / "e")])
    assert not (tmp_path / "e").exists()


def test_an_export_is_replaced_but_another_directory_is_never_overwritten(run_dir, tmp_path):
    out = tmp_path / "x"
    main([str(run_dir), "--role", "execution", "--out", str(out)])
    (out / "model.safetensors").write_bytes(b"stale")
    main([str(run_dir), "--role", "execution", "--out", str(out)])  # an earlier export: replaced whole
    assert (out / "model.safetensors").stat().st_size > 100
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match="not an export of this tool"):
        main([str(run_dir), "--role", "execution", "--out", str(other)])
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("args, message", [
    (["{missing}"], "no such run directory"),
    (["{empty}"], "holds no state.pt or config.yaml: not a training run directory"),
    (["{run}", "--role", "critic"], "unknown role 'critic': one of planning, execution, evaluation or all"),
    (["{run}", "--dtype", "int8"], "--dtype 'int8': one of float32, bfloat16, float16"),
])
def test_bad_input_is_a_message_not_a_traceback(run_dir, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "run": run_dir}
    with pytest.raises(SystemExit) as err:
        main([a.format(**paths) for a in args] + ["--out", str(tmp_path / "out")])
    assert isinstance(err.value.code, str) and err.value.code.startswith("[export] ") and message in err.value.code
    assert not (tmp_path / "out").exists()


def test_a_thinned_checkpoint_says_so(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(EXPORT))
    (copy / "checkpoints" / "iter1" / "planning" / "model.pt").unlink()
    with pytest.raises(SystemExit, match=r"iter1/planning holds no model.pt \(removed by schedule.checkpoint_ret"):
        main([str(copy), "--role", "planning", "--out", str(tmp_path / "out")])


def test_auto_exports_bfloat16(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``model.dtype=auto`` exports bfloat16: a run on a bf16 machine stores the bfloat16 it chose, and a config that
    still says ``auto`` gives bfloat16 on any machine (the module docstring, ``--dtype``'s help). The CPU flags are
    faked (``precision.cpu_flags``, as tests/loop/test_precision_run.py does), so this holds on an AVX2 CPU."""
    monkeypatch.setattr(precision, "cpu_flags", lambda path="/proc/cpuinfo": frozenset({"avx2", "amx_bf16"}))
    run = tmp_path / "run"
    OuterLoop(compose(["experiment=tiny", "model.dtype=auto", "schedule.export_at_end=false"]), run).run()
    run_cfg = OmegaConf.load(run / "config.yaml")
    assert run_cfg.model.dtype == "bfloat16" and "amx_bf16" in run_cfg.precision_reason  # resolved at the start
    out = tmp_path / "execution"
    main([str(run), "--role", "execution", "--out", str(out)])
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / EXPORT_META).read_text())["dtype"] == "bfloat16"
    # A config.yaml that left model.dtype auto (written by hand, or by a tool that does not resolve it), exported on an
    # AVX2-only machine, where a run's auto would pick float32: still bfloat16, the export's own default.
    monkeypatch.setattr(precision, "cpu_flags", lambda path="/proc/cpuinfo": frozenset({"avx2", "fma"}))
    run_cfg.model.dtype = "auto"
    assert export_dtype(run_cfg, None) == "bfloat16" and export_dtype(run_cfg, "float32") == "float32"
    OmegaConf.save(run_cfg, run / "config.yaml")
    main([str(run), "--role", "execution", "--out", str(out)])  # out holds our earlier export: replaced
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / EXPORT_META).read_text())["dtype"] == "bfloat16"
    assert all(p.dtype == torch.bfloat16 for p in AutoModelForCausalLM.from_pretrained(out).parameters())


def test_another_models_directory_is_refused_untouched_and_an_empty_one_accepted(run_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """Only our marker file (``unifiedplayers_export.json``) makes an existing ``--out`` ours to replace: another
    tool's Hugging Face directory has a config.json and weights too, and must survive byte for byte."""
    other = tmp_path / "someone_elses_model"
    other.mkdir()
    files = {"config.json": b'{"model_type": "llama", "hidden_size": 8}\n', "model.safetensors": bytes(range(256)) * 4,
             "tokenizer.json": b"{}\n"}
    for name, data in files.items():
        (other / name).write_bytes(data)
    with pytest.raises(SystemExit, match="not an export of this tool"):
        main([str(run_dir), "--role", "execution", "--out", str(other)])
    assert {p.name: p.read_bytes() for p in other.iterdir()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["someone_elses_model"]  # no temporary directory left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(run_dir), "--role", "execution", "--out", str(empty)]) == [empty]
    assert (empty / EXPORT_META).is_file() and (empty / "model.safetensors").stat().st_size > 100


CPU_PRESETS = ("smoke", "figure1_smoke", "ablation_smoke")


def weight_files(run_dir: Path) -> list[str]:
    """Every file of the run directory that holds a model's weights: a checkpoint's model.pt or reference.pt, stale
    feedback's published copies, an export's safetensors (or a .bin), relative to the run."""
    names = {"model.pt", "reference.pt"}
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and (
        p.name in names or p.suffix in (".safetensors", ".bin") or "published" in p.parts))


def test_a_cpu_presets_finished_run_keeps_each_players_weights_once(tmp_path: Path) -> None:
    """The CPU presets export on demand, not at the end of the run (the end-of-run export is model.pt cast to the
    sampling dtype: `make run` held 2.43 GB with it, 1.6 GB without). A tiny run with each preset's
    ``export_at_end`` and ``checkpoint_retention`` keeps one weight file per kept player, its checkpoint's model.pt
    (what eval/ and the probes read), and ``--role all`` then exports the players whose weights were kept."""
    by_settings: dict[tuple[bool, str], list[str]] = {}
    for name in CPU_PRESETS:
        schedule = compose([f"experiment={name}"]).schedule
        by_settings.setdefault((bool(schedule.export_at_end), str(schedule.checkpoint_retention)), []).append(name)
    for (at_end, keep), presets in by_settings.items():
        run = tmp_path / keep
        OuterLoop(compose(["experiment=tiny", f"schedule.export_at_end={at_end}",
                           f"schedule.checkpoint_retention={keep}"]), run).run()
        kept = ["execution"] if keep == "execution_weights" else list(ROLES)
        assert weight_files(run) == sorted(f"checkpoints/iter1/{r}/model.pt" for r in kept), presets
        assert main([str(run), "--role", "all"]) == [run / EXPORT / r for r in ROLES if r in kept]
        assert weight_files(run) == sorted([f"checkpoints/iter1/{r}/model.pt" for r in kept]
                                           + [f"{EXPORT}/{r}/model.safetensors" for r in kept])
