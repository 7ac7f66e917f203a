"""A default is written once, in the schema (``unifiedplayers.config``, ``eval.config``, ``SandboxConfig``); a YAML
file under conf/ sets only what it changes.

- A restatement: a key that sets the value its config already has without it. What a file sets over: the schema
  for conf/config.yaml, conf/evaluate.yaml and a group's option (with the options its own defaults list names); the
  composed config without the file's own keys for a preset of the whole config (``# @package _global_``: the
  experiment, method and ablation presets). A preset's key that pins a value which another choice composed before
  it (another option of the key's group, an experiment under a method) would change is no restatement, unless a
  preset it extends pins it already. A group choice in a defaults list restates when it picks the option already
  chosen.
- A disagreement: a key set in an option that conf/config.yaml or conf/evaluate.yaml chooses by default. Its value
  is the default, so the schema holds it. Only what the schema leaves to a preset is set there: the backbone
  (model), the players' prompts and topics (player), the benchmarks and prompts of the evaluation (eval).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eval.config import EvaluateConfig
from unifiedplayers.config import CONF_DIR, Config, compose

pytestmark = pytest.mark.cpu

SCHEMAS = {"config": Config, "evaluate": EvaluateConfig}
KEPT_BY_DEFAULT_OPTIONS = {"model": ("",), "player": ("planning.", "execution.", "evaluation.", "topics"),
                           "eval": ("name", "run", "benchmarks.", "prompts.")}
FILES = sorted(str(p.relative_to(CONF_DIR)) for p in CONF_DIR.rglob("*.yaml"))


def is_global(path: Path) -> bool:
    return "@package _global_" in path.read_text()


def defaults_list(path: Path) -> list:
    return list(OmegaConf.to_container(OmegaConf.load(path)).get("defaults") or [])


def body(path: Path) -> dict:
    loaded = OmegaConf.to_container(OmegaConf.load(path))
    return {k: v for k, v in loaded.items() if k not in ("defaults", "hydra")}


def leaves(node: dict, under: object, prefix: str = ""):
    """(key, value, value beneath or KeyError) of every leaf of ``node``, ``under`` the config it sets over."""
    for key, value in node.items():
        below = under.get(key, KeyError) if isinstance(under, dict) else KeyError
        if isinstance(value, dict) and value and isinstance(below, dict):
            yield from leaves(value, below, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value, below


def schema_of(group: str | None, root: str) -> dict:
    schema = OmegaConf.to_container(OmegaConf.structured(SCHEMAS[root]))
    return schema if group is None else schema[group]


def option_beneath(group: str, path: Path) -> dict:
    """What a group's option sets over: the schema's node with the options of its defaults list merged in."""
    merged = OmegaConf.create(schema_of(group, "evaluate" if group == "eval" else "config"))
    for entry in defaults_list(path):
        if isinstance(entry, str) and entry != "_self_":
            parent = path.parent / f"{entry}.yaml"
            merged = OmegaConf.merge(merged, option_beneath(group, parent), body(parent))
    return OmegaConf.to_container(merged)


def preset_beneath(rel: str, tmp_path: Path) -> dict:
    """A global preset's config composed without its own keys (its defaults list kept)."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    stripped = {"defaults": defaults_list(CONF_DIR / rel)} if defaults_list(CONF_DIR / rel) else {}
    (conf / rel).write_text("# @package _global_\n" + (OmegaConf.to_yaml(stripped) if stripped else ""))
    group, option = rel.split("/", 1)
    cfg = compose([f"{group}={option.removesuffix('.yaml')}"], config_dir=conf)
    return OmegaConf.to_container(cfg)


def at(node: object, key: str) -> object:
    for part in key.split("."):
        node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
    return node


def extended(path: Path) -> list[Path]:
    """The presets ``path`` extends (its defaults list's entries of its own group), nearest first."""
    parents = [path.parent / f"{e}.yaml" for e in defaults_list(path) if isinstance(e, str) and e != "_self_"]
    return [p for parent in parents for p in [parent, *extended(parent)]]


def alternatives(rel: str, key: str) -> list:
    """The values of ``key`` under the other choices composed before the preset ``rel``: each option of the key's
    group, and each preset of a group listed before the preset's own in conf/config.yaml (experiment < method)."""
    group, found = key.split(".", 1)[0], []
    if (CONF_DIR / group).is_dir() and group in schema_of(None, "config"):
        for option in sorted((CONF_DIR / group).glob("*.yaml")):
            if not is_global(option):
                found.append(at(OmegaConf.to_container(OmegaConf.merge(option_beneath(group, option), body(option))),
                                key.split(".", 1)[1]))
    order = list(default_choices())
    for earlier in order[:order.index(rel.split("/", 1)[0])]:
        found += [at(body(p), key) for p in sorted((CONF_DIR / earlier).glob("*.yaml")) if is_global(p)]
    return [v for v in found if v is not KeyError]


def default_choices(root: str = "config") -> dict[str, str]:
    entries = defaults_list(CONF_DIR / f"{root}.yaml")
    return {g: o for e in entries if isinstance(e, dict) for g, o in e.items() if root == "config" or o is not None}


def choices_beneath(path: Path) -> dict[str, str]:
    """The group choices a preset's defaults list overrides: config.yaml's, then those of the presets it extends."""
    choices = default_choices()
    for parent in reversed(extended(path)):
        choices.update(overrides(parent))
    return choices


def overrides(path: Path) -> dict[str, str]:
    return {k.split("/", 1)[1]: v for e in defaults_list(path) if isinstance(e, dict)
            for k, v in e.items() if k.startswith("override /")}


def pins(rel: str, key: str, value: object) -> bool:
    """Whether a global preset's ``key`` keeps ``value`` where another choice would change it."""
    if any(at(body(parent), key) is not KeyError for parent in extended(CONF_DIR / rel)):
        return False
    return any(v != value for v in alternatives(rel, key))


@pytest.mark.parametrize("rel", FILES)
def test_no_yaml_key_restates_what_it_sets_over(rel, tmp_path):
    path = CONF_DIR / rel
    group = rel.split("/", 1)[0] if "/" in rel else None
    if group is None:
        beneath = schema_of(None, Path(rel).stem)
    elif is_global(path):
        beneath = preset_beneath(rel, tmp_path)
    else:
        beneath = option_beneath(group, path)
    restated = [f"{key} = {value!r}" for key, value, below in leaves(body(path), beneath)
                if value == below and not (is_global(path) and pins(rel, key, value))]
    if group is not None:
        below = choices_beneath(path)
        restated += [f"override /{g}: {o}" for g, o in overrides(path).items() if below.get(g) == o]
    assert not restated, f"conf/{rel} restates what it sets over (delete these keys): {restated}"


@pytest.mark.parametrize("root", sorted(SCHEMAS))
def test_the_options_chosen_by_default_hold_no_default_of_their_own(root):
    disagreements = []
    for group, option in default_choices(root).items():
        if option is None:
            continue
        if group in ("experiment", "method", "ablation") and is_global(CONF_DIR / group / f"{option}.yaml"):
            continue  # a preset, not a default: covered by the restatement test
        rel = f"{group}/{option}.yaml"
        kept = KEPT_BY_DEFAULT_OPTIONS.get(group, ())
        keys = body(CONF_DIR / rel)
        disagreements += [f"{rel}: {key}" for key, _, _ in leaves(keys, keys)
                          if not key.startswith(kept)]
    assert not disagreements, f"default options that set a value the schema does not hold: {disagreements}"


def test_a_restated_key_is_found(tmp_path):
    beneath = schema_of("trainer", "config")
    found = [k for k, v, below in leaves({"lr": beneath["lr"], "kl_coef": 0.5, "lora": {"rank": 0}}, beneath)
             if v == below]
    assert found == ["lr", "lora.rank"]
    below = preset_beneath("experiment/smoke.yaml", tmp_path)
    assert below["trainer"]["temperature"] == 1.0 and below["experiment"] is None  # the body's keys are gone
    assert choices_beneath(CONF_DIR / "experiment/one_gpu.yaml")["trainer"] == "deepspeed_zero3"  # the parent's
    assert pins("experiment/smoke.yaml", "trainer.micro_batch_size", 4)  # deepspeed_zero3 would make it 2
    assert not pins("experiment/smoke.yaml", "trainer.lr", 1e-6)  # no trainer option changes lr
    assert pins("method/absolute_zero.yaml", "player.planning.response_prefix", "")  # tiny's is a task
    assert not pins("experiment/one_gpu.yaml", "trainer.micro_batch_size", 2)  # paper_qwen3_4b pins it already
