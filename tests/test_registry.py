"""One registry for every extension point: a duplicate name is refused naming the kind, the name and
where the first was defined; a miss names the known entries; a module imported again may register its own
definitions again. Every ``register_*`` of the package refuses a duplicate (none overwrites silently)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from unifiedplayers.registry import DuplicateName, Registry, UnknownName

pytestmark = pytest.mark.cpu


def first(x):
    return x


def second(x):
    return x


# --------------------------------------------------------------------------------------------------
# The helper


def test_a_duplicate_name_is_refused_naming_the_kind_the_name_and_the_first_definition():
    reg = Registry("widget")
    assert reg.register("a", first) is first
    with pytest.raises(DuplicateName, match=r"widget 'a' is already registered, by .*test_registry\.first .*second"):
        reg.register("a", second)
    assert reg.get("a") is first and isinstance(DuplicateName("x"), ValueError)

    @reg.register("b")
    def third(x):
        return x

    with pytest.raises(ValueError, match="widget 'b' is already registered"):
        reg.register("b")(second)  # the decorator form too
    assert reg.names() == ["a", "b"] and "b" in reg and "c" not in reg and len(reg) == 2


def test_a_miss_names_the_known_entries_and_is_a_key_error_and_a_value_error():
    reg = Registry("widget", "conf.widget")
    reg.register("alpha", first)
    reg.register("beta", second)
    for err in (KeyError, ValueError):
        with pytest.raises(err, match=r"unknown conf.widget 'gamma'; known: \['alpha', 'beta'\]"):
            reg.get("gamma")
    with pytest.raises(UnknownName):
        reg["gamma"]  # noqa: B018
    assert reg.get("gamma", None) is None


def test_the_same_object_again_is_fine_and_so_is_a_second_import_of_its_module(tmp_path, monkeypatch):
    reg = Registry("widget")
    reg.register("a", first)
    reg.register("a", first)
    assert reg.get("a") is first
    # data registered twice from one place in one run of a module is two objects: refused
    with pytest.raises(DuplicateName):
        for obj in ({"v": 1}, {"v": 2}):
            reg.register("data", obj)
    # a module imported a second time (its namespace is new) registers its definitions again: they replace the old
    (tmp_path / "widgets_mod.py").write_text(textwrap.dedent("""
        from test_registry_support import REG

        @REG.register("w")
        def w():
            return 1

        REG.register("d", {"data": 1})
    """))
    (tmp_path / "test_registry_support.py").write_text("from unifiedplayers.registry import Registry\n"
                                                       "REG = Registry('widget')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import test_registry_support
        import widgets_mod

        old = test_registry_support.REG.get("w")
        sys.modules.pop("widgets_mod")
        import widgets_mod  # noqa: F811

        assert test_registry_support.REG.get("w") is widgets_mod.w is not old
    finally:
        sys.modules.pop("widgets_mod", None)
        sys.modules.pop("test_registry_support", None)


def test_a_loader_string_is_imported_on_first_use_and_taken_over_by_what_it_names():
    reg = Registry("widget")
    reg.register("d", "unifiedplayers.registry:definition")
    from unifiedplayers.registry import definition

    assert reg.get("d") is definition
    reg2 = Registry("widget")
    reg2.register("d", "unifiedplayers.registry:definition")
    with pytest.raises(DuplicateName, match="by loader 'unifiedplayers.registry:definition'"):
        reg2.register("d", first)  # not what the string names
    reg2.register("d", definition)  # what it names: takes its place
    assert reg2.get("d") is definition and reg2.origin("d").startswith("unifiedplayers.registry.definition")


def test_a_loader_string_is_taken_over_only_by_its_own_module_s_object():
    """A class of the same name from another module is not what the string names: refused, not taken over."""
    reg = Registry("widget")
    reg.register("d", "unifiedplayers.registry:definition")
    namesake = type("definition", (), {})  # qualname "definition", defined in this test module
    assert namesake.__qualname__ == "definition" and namesake.__module__ == __name__
    with pytest.raises(DuplicateName, match="by loader 'unifiedplayers.registry:definition'"):
        reg.register("d", namesake)
    assert reg.names() == ["d"] and isinstance(reg._entries["d"], str)  # still the loader string


# --------------------------------------------------------------------------------------------------
# Every extension point refuses a duplicate: a new name taken twice, and a built-in's name


def test_item_assignment_is_checked_like_register_and_replaced_is_the_one_way_to_overwrite():
    reg = Registry("thing")
    reg["a"] = first
    reg["a"] = first  # the same object again: fine
    with pytest.raises(DuplicateName, match="thing 'a' is already registered"):
        reg["a"] = second
    assert reg["a"] is first
    with reg.replaced("a", second) as stand_in:
        assert stand_in is second and reg["a"] is second and "replacement" in reg.origin("a")
    assert reg["a"] is first and "first" in reg.origin("a")
    with pytest.raises(RuntimeError), reg.replaced("b", second):  # a new name is removed again, even on an error
        assert reg["b"] is second
        raise RuntimeError
    assert "b" not in reg and reg.names() == ["a"]


def test_register_method_refuses_a_duplicate():
    from unifiedplayers.methods import METHODS, Method, register_method

    class One(Method):
        pass

    class Two(Method):
        pass

    register_method("test_registry_method")(One)
    try:
        with pytest.raises(DuplicateName, match="method 'test_registry_method' is already registered"):
            register_method("test_registry_method")(Two)
        with pytest.raises(DuplicateName, match="method 'unifiedplayers'"):
            register_method("unifiedplayers")(Two)
        assert METHODS.get("test_registry_method") is One and METHODS.get("unifiedplayers") is Method
    finally:
        METHODS.pop("test_registry_method", None)


def test_register_reward_source_refuses_a_duplicate():
    from unifiedplayers.methods import REWARD_SOURCES, register_reward_source, reward_source

    register_reward_source("planning", "test_registry_source")(first)
    try:
        with pytest.raises(DuplicateName, match="planning reward source 'test_registry_source'"):
            register_reward_source("planning", "test_registry_source")(second)
        with pytest.raises(DuplicateName, match="execution reward source 'verdict'"):
            register_reward_source("execution", "verdict")(second)
        assert reward_source("planning", "test_registry_source").fn is first
        register_reward_source("execution", "test_registry_source")(second)  # another role: another registry
    finally:
        REWARD_SOURCES["planning"].pop("test_registry_source", None)
        REWARD_SOURCES["execution"].pop("test_registry_source", None)


def test_register_trainer_backend_refuses_a_duplicate():
    from unifiedplayers.trainer import TRAINER_BACKENDS, TorchTrainer, register_trainer_backend

    register_trainer_backend("test_registry_backend")(first)
    try:
        with pytest.raises(DuplicateName, match="trainer backend 'test_registry_backend'"):
            register_trainer_backend("test_registry_backend")(second)
        with pytest.raises(DuplicateName, match="trainer backend 'torch'"):
            register_trainer_backend("torch")(second)
        # deepspeed_zero3, whether still its loader string or already imported: another class is refused
        with pytest.raises(DuplicateName, match="trainer backend 'deepspeed_zero3'"):
            register_trainer_backend("deepspeed_zero3")(second)
        assert TRAINER_BACKENDS.get("torch") is TorchTrainer
    finally:
        TRAINER_BACKENDS.pop("test_registry_backend", None)


def test_register_rollout_engine_refuses_a_duplicate():
    from unifiedplayers.rollout import ROLLOUT_ENGINES, RolloutEngine, register_rollout_engine
    from unifiedplayers.rollout.hf_engine import HFRollout

    class One(RolloutEngine):
        pass

    class Two(RolloutEngine):
        pass

    register_rollout_engine("test_registry_engine")(One)
    try:
        with pytest.raises(DuplicateName, match="rollout engine 'test_registry_engine'"):
            register_rollout_engine("test_registry_engine")(Two)
        for name in ("hf", "vllm"):
            with pytest.raises(DuplicateName, match=f"rollout engine '{name}'"):
                register_rollout_engine(name)(Two)
        assert ROLLOUT_ENGINES.get("hf") is HFRollout
    finally:
        ROLLOUT_ENGINES.pop("test_registry_engine", None)


def test_register_rule_refuses_a_duplicate():
    from unifiedplayers.feedback.perturbation import ALL_RULES, RULES, register_rule, step_drop

    register_rule("test_registry_rule", "local")(first)
    try:
        with pytest.raises(DuplicateName, match="perturbation rule 'test_registry_rule'"):
            register_rule("test_registry_rule", "global")(second)
        with pytest.raises(DuplicateName, match="perturbation rule 'step_drop'"):
            register_rule("step_drop", "local")(second)
        with pytest.raises(ValueError, match="scope"):
            register_rule("test_registry_rule_2", "sideways")
        assert RULES.get("step_drop").fn is step_drop and "test_registry_rule" not in ALL_RULES
    finally:
        RULES.pop("test_registry_rule", None)


def test_register_benchmark_refuses_a_duplicate():
    from unifiedplayers.data.benchmarks import REGISTRY, Benchmark, register_benchmark

    one = Benchmark("test_registry_bench", "T", "offline", "string", "pass@1", {"question": "q", "answer": "a"})
    register_benchmark(one)
    try:
        with pytest.raises(DuplicateName, match="benchmark 'test_registry_bench'"):
            register_benchmark(Benchmark("test_registry_bench", "T2", "offline", "math", "pass@1", {}))
        with pytest.raises(DuplicateName, match="benchmark 'gsm8k'"):
            register_benchmark(Benchmark("gsm8k", "G", "math", "math", "pass@1", {}))
        assert REGISTRY.get("test_registry_bench") is one and REGISTRY.get("gsm8k").title == "GSM8K"
    finally:
        REGISTRY.pop("test_registry_bench", None)


# --------------------------------------------------------------------------------------------------
# Extensions from outside the package: one module each


def test_a_rollout_engine_outside_the_package_is_named_by_its_target(tmp_path, monkeypatch):
    from unifiedplayers.config import RolloutConfig
    from unifiedplayers.loop.engines import RolloutEngines
    from unifiedplayers.rollout import build_rollout, check_backend

    (tmp_path / "echo_engine.py").write_text(textwrap.dedent("""
        from unifiedplayers.rollout import RolloutEngine

        class EchoEngine(RolloutEngine):
            samples_from_module = True

            @classmethod
            def check(cls, cfg):
                if cfg.max_new_tokens > 100:
                    raise RuntimeError("echo engine: max_new_tokens <= 100")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = RolloutConfig(backend="echo", _target_="echo_engine.EchoEngine", max_new_tokens=8)
        check_backend(cfg)
        engine = build_rollout(cfg, model="m", tokenizer="t")
        assert type(engine).__name__ == "EchoEngine" and engine.model == "m"
        with pytest.raises(RuntimeError, match="echo engine"):
            check_backend(RolloutConfig(backend="echo", _target_="echo_engine.EchoEngine", max_new_tokens=200))
        engines = RolloutEngines(cfg, tokenizer=None, build=lambda c, model, tok: object())
        a, b = object(), object()
        assert engines.engine(a, 0) is engines.engine(a, 0) is not engines.engine(b, 0)  # one per module
        with pytest.raises(ValueError, match="rollout._target_='nowhere.Engine' cannot be imported"):
            build_rollout(RolloutConfig(_target_="nowhere.Engine"), None, None)
        with pytest.raises(ValueError, match=r"unknown rollout.backend 'sglang'; known: \['hf', 'vllm'"):
            check_backend(RolloutConfig(backend="sglang"))
    finally:
        sys.modules.pop("echo_engine", None)


def test_a_benchmark_outside_the_package_registers_its_loader_and_grader(tmp_path, monkeypatch):
    from unifiedplayers.data.benchmarks import REGISTRY, import_benchmark_modules, load_benchmark

    (tmp_path / "echo_bench.py").write_text(textwrap.dedent("""
        from unifiedplayers.data.benchmarks import Benchmark, Problem, register_benchmark

        def parse_row(row, index, fields):
            return Problem(f"echo-{index}", "Repeat: " + row["word"], row["word"][::-1])

        def grader(prediction, reference):  # the reference is stored reversed
            return prediction is not None and prediction[::-1] == reference

        register_benchmark(Benchmark("echo_bench", "Echo", "offline", "string", "pass@1", {},
                                     parse_row=parse_row, grader=grader))
    """))
    (tmp_path / "echo.jsonl").write_text('{"word": "apple"}\n{"word": "pear"}\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import_benchmark_modules([None, SimpleNamespace(module=None), SimpleNamespace(module="echo_bench")])
        problems = load_benchmark("echo_bench", str(tmp_path / "echo.jsonl"))
        assert [(p.id, p.question, p.reference) for p in problems] == [("echo-0", "Repeat: apple", "elppa"),
                                                                     ("echo-1", "Repeat: pear", "raep")]
        bench = REGISTRY.get("echo_bench")
        assert bench.grade("apple", "elppa") and not bench.grade("elppa", "elppa") and not bench.grade(None, "x")
        assert REGISTRY.get("gsm8k").grade("1,000", "1000")  # a built-in: its answer type's grader
        with pytest.raises(ValueError, match="'no_such_bench' cannot be imported"):
            import_benchmark_modules([SimpleNamespace(module="no_such_bench")])
    finally:
        sys.modules.pop("echo_bench", None)
        REGISTRY.pop("echo_bench", None)


def test_registering_the_engines_imports_neither_vllm_nor_its_engine():
    code = ("import sys\n"
            "from unifiedplayers.config import RolloutConfig\n"
            "from unifiedplayers.rollout import ROLLOUT_ENGINES, check_backend\n"
            "check_backend(RolloutConfig(backend='hf'))\n"
            "assert ROLLOUT_ENGINES.names() == ['hf', 'vllm'], ROLLOUT_ENGINES.names()\n"
            "assert not {'vllm', 'unifiedplayers.rollout.vllm_engine'} & set(sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
