"""Every config file in conf/ composes against the typed schema; bad keys and types fail at start-up."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from unifiedplayers.config import CONF_DIR, compose

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())


def all_options():
    for group in GROUPS:
        for f in sorted((CONF_DIR / group).rglob("*.yaml")):
            yield group, str(f.relative_to(CONF_DIR / group).with_suffix(""))


def test_every_design_card_group_exists():
    for g in ["model", "player", "reward", "perturbation", "schedule", "trainer", "rollout", "sandbox",
              "logger", "method", "experiment", "ablation"]:
        assert g in GROUPS, g


def test_root_config_composes():
    cfg = compose()
    assert cfg.sandbox.timeout_s == 10.0 and cfg.sandbox.memory_mb == 512
    assert OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


# Groups that belong to another root config than conf/config.yaml, and how to register its schema.
OTHER_ROOTS = {"eval": "evaluate"}


def _root_for(group: str) -> str:
    root = OTHER_ROOTS.get(group, "config")
    if root == "evaluate":
        from eval.config import register_eval_configs  # the harness lives in the repo's eval/

        register_eval_configs()
    return root


def test_every_root_config_composes():
    for f in sorted(CONF_DIR.glob("*.yaml")):
        group = next((g for g, r in OTHER_ROOTS.items() if r == f.stem), None)
        root = _root_for(group) if group else f.stem
        OmegaConf.to_container(compose(config_name=root), resolve=True, throw_on_missing=False)


@pytest.mark.parametrize("group,name", list(all_options()), ids=lambda x: str(x))
def test_every_config_file_composes(group, name):
    cfg = compose([f"{group}={name}"], config_name=_root_for(group))
    # Resolve everything, so that a bad interpolation or a missing mandatory value fails here.
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=group not in {"ablation"})
    # A check error earns no ρ_adv credit in every preset: crediting it is the named ablation alone (SPEC §5).
    if group in ("experiment", "ablation", "method") or (group == "reward" and name != "errors_credited"):
        assert cfg.reward.variant_error_credit is False, f"{group}={name} credits check errors"


def chain(exc: BaseException) -> str:
    """The message of an exception and of every exception it wraps."""
    parts = []
    while exc is not None:
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def test_unknown_key_fails_with_its_name():
    with pytest.raises(Exception) as exc:
        compose(["sandbox.timout_s=3"])
    assert "timout_s" in chain(exc.value)
    assert "unknown key (did you mean `timeout_s`?)" in chain(exc.value)  # the closest key, before Hydra


def test_wrong_type_fails_with_its_name():
    with pytest.raises(Exception) as exc:
        compose(["sandbox.memory_mb=lots"])
    msg = chain(exc.value)
    assert "memory_mb" in msg and "ValidationError" in msg


def test_unknown_group_option_fails():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException):
        compose(["trainer=does_not_exist"])


def test_a_config_file_with_a_misspelt_key_fails(tmp_path: Path):
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "sandbox" / "default.yaml").write_text("timeout_s: 10\nmemroy_mb: 512\n")
    with pytest.raises(Exception) as exc:
        compose(config_dir=conf)
    assert "memroy_mb" in chain(exc.value)


def _options(group: str) -> list[str]:
    return [name for g, name in all_options() if g == group]


@pytest.mark.parametrize("experiment", _options("experiment"))
@pytest.mark.parametrize("method", _options("method"))
def test_every_method_on_every_experiment_passes_the_start_up_checks(method, experiment):
    """What a sweep composes (method × preset) is accepted by the outer loop's start-up checks, so that no
    member of `make reproduce-table1` fails only when its turn comes (e.g. a preset's topics that are no
    Absolute Zero task types, or a plain-text method whose prompt asks for code)."""
    from unifiedplayers.checks import validate

    overrides = [f"method={method}", f"experiment={experiment}"]
    if method == "socratic_zero":  # it stops at start-up without a Teacher, by design
        overrides += ["method.extra.teacher_endpoint=http://127.0.0.1:9/v1", "method.extra.teacher_model=t"]
    validate(compose(overrides))
