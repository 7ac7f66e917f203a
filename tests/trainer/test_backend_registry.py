"""The trainer backend registry: backends by name, imported lazily, never importing each other."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import unifiedplayers.trainer as trainer_pkg
from unifiedplayers.trainer import TRAINER_BACKENDS, BaseTrainer, TorchTrainer, build_trainer, register_trainer_backend
from unifiedplayers.trainer import backends, torch_backend

from tests.trainer.trainer_helpers import tiny_model, trainer_config

pytestmark = pytest.mark.cpu

TRAINER_DIR = Path(trainer_pkg.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_backends_import_the_interface_never_each_other():
    torch_imports = _imported_modules(TRAINER_DIR / "torch_backend.py")
    ds_imports = _imported_modules(TRAINER_DIR / "deepspeed_backend.py")
    assert "unifiedplayers.trainer.base" in torch_imports and "unifiedplayers.trainer.base" in ds_imports
    assert "unifiedplayers.trainer.deepspeed_backend" not in torch_imports
    assert "unifiedplayers.trainer.torch_backend" not in ds_imports
    for interface in ("base.py", "backends.py"):  # the registry names the built-in backends by string only
        assert not {m for m in _imported_modules(TRAINER_DIR / interface) if m.endswith(("torch_backend", "_backend"))}


def test_every_builtin_backend_is_known_and_resolves():
    assert {"torch", "deepspeed_zero2", "deepspeed_zero3"} <= set(TRAINER_BACKENDS)
    assert TRAINER_BACKENDS["torch"] is TorchTrainer is torch_backend.TorchTrainer
    for name, stage in (("deepspeed_zero2", 2), ("deepspeed_zero3", 3)):
        cls = backends._resolve_backend(name)  # imports deepspeed_backend (not deepspeed itself)
        assert issubclass(cls, BaseTrainer) and not issubclass(cls, TorchTrainer) and cls.stage == stage
        assert TRAINER_BACKENDS[name] is cls


def test_build_trainer_uses_the_registered_factory(monkeypatch):
    monkeypatch.setitem(TRAINER_BACKENDS, "torch", TRAINER_BACKENDS["torch"])  # restored after the test
    model, _ = tiny_model()
    trainer = build_trainer(trainer_config(), model)
    assert type(trainer) is TorchTrainer and trainer.backend == "torch"

    built = []

    @register_trainer_backend("custom_test_backend")
    def factory(cfg, model, **kwargs):
        built.append(kwargs)
        return "built"

    try:
        assert build_trainer(trainer_config(backend="custom_test_backend"), model, role="r") == "built"
        assert built == [{"role": "r"}]
        monkeypatch.setitem(TRAINER_BACKENDS, "by_path", "unifiedplayers.trainer.torch_backend:TorchTrainer")
        assert type(build_trainer(trainer_config(backend="by_path"), model)) is TorchTrainer
        assert TRAINER_BACKENDS["by_path"] is TorchTrainer  # resolved once, then kept
    finally:
        TRAINER_BACKENDS.pop("custom_test_backend", None)
