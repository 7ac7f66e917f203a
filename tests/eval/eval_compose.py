"""The ``evaluate`` config composed with overrides, for the eval tests (importable by name: see conftest.py)."""
from pathlib import Path

from hydra import compose, initialize_config_dir

from eval.config import register_eval_configs

CONF = str(Path(__file__).resolve().parents[2] / "conf")
register_eval_configs()


def compose_eval(overrides):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("evaluate", overrides=overrides)
