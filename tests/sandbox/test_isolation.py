"""What isolation a sandbox reports it got (``unifiedplayers.sandbox.isolation``): every layer present here, a
layer switched off by the config or refused by the machine missing with its reason in words."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import unifiedplayers.sandbox
from unifiedplayers.sandbox import Sandbox, SandboxConfig, isolation_line, isolation_report
from unifiedplayers.sandbox.isolation import LAYERS, missing_layer_warnings

IS_ROOT_ON_LINUX = os.geteuid() == 0 and sys.platform == "linux"
ALL = ["netns", "uid", "landlock", "tmpfs"]  # as root; through a user namespace pidns takes uid's place


def _report(**settings) -> dict:
    config = SandboxConfig(timeout_s=5, **settings)
    with Sandbox(config) as sb:
        assert sb.run("print(6 * 7)").stdout == "42\n"
        return isolation_report(sb.config, sb.isolation)


@pytest.mark.skipif(not IS_ROOT_ON_LINUX, reason="the uid drop and the private tmpfs need root")
def test_every_layer_is_present_here():
    report = _report()
    assert report == {"mechanism": "root", "present": ALL, "missing": {}}
    assert isolation_line(report) == "netns, uid, landlock, tmpfs (all layers, as root)"
    assert missing_layer_warnings(report) == []


def test_layers_switched_off_by_the_config_are_missing_with_the_key():
    report = _report(landlock=False, network=True)
    assert report["missing"]["landlock"] == "switched off by sandbox.landlock=false"
    assert report["missing"]["netns"] == "switched off by sandbox.network=true"
    assert "landlock" not in report["present"] and "netns" not in report["present"]
    if IS_ROOT_ON_LINUX:
        assert report["present"] == ["uid", "tmpfs"]
    texts = missing_layer_warnings(report)
    assert any(t.startswith("sandbox isolation: layer 'landlock' is missing (switched off by sandbox.landlock=false)")
               and "outside its working directory" in t for t in texts)
    line = isolation_line(report)
    assert "MISSING" in line and "landlock: switched off by sandbox.landlock=false" in line


def test_every_missing_layer_has_a_reason():
    """The machine's reasons come from the server (``isolation["reasons"]``); a layer missing without one still
    says so in words."""
    config = SandboxConfig()
    iso = {"uid": False, "netns": False, "landlock": True, "tmpfs": False,
           "reasons": {"uid": "not root (uid 1000): cannot drop to a per-call uid",
                       "netns": "unshare(CLONE_NEWNET) failed: Operation not permitted"}}
    report = isolation_report(config, iso)
    assert report["present"] == ["landlock"]
    assert report["missing"] == {"netns": "unshare(CLONE_NEWNET) failed: Operation not permitted",
                                 "uid": "not root (uid 1000): cannot drop to a per-call uid",
                                 "tmpfs": "unavailable on this machine (no reason given)"}
    assert [t.split("'")[1] for t in missing_layer_warnings(report)] == ["netns", "uid", "tmpfs"]
    assert report["mechanism"] == "none" and set(LAYERS) == {*ALL, "pidns"}
    assert isolation_line(report).startswith("landlock (not root, no user namespace); MISSING netns: unshare")


def test_through_a_user_namespace_the_process_layer_is_pidns():
    """A server that is not root and entered a user namespace reports pidns in the place of uid: present, or
    missing with the kernel's reason; uid is no layer of that mechanism, whatever drop_privileges says."""
    iso = {"mechanism": "user namespace", "uid": False, "pidns": True, "netns": True, "landlock": True,
           "tmpfs": True, "reasons": {}}
    report = isolation_report(SandboxConfig(drop_privileges=False), iso)
    assert report == {"mechanism": "user namespace", "present": ["netns", "pidns", "landlock", "tmpfs"], "missing": {}}
    assert isolation_line(report) == "netns, pidns, landlock, tmpfs (all layers, through a user namespace)"
    why = "this kernel counts RLIMIT_NPROC per uid over the whole machine"
    report = isolation_report(SandboxConfig(), dict(iso, pidns=False, reasons={"pidns": why}))
    assert report["missing"] == {"pidns": why}
    assert missing_layer_warnings(report) == [f"sandbox isolation: layer 'pidns' is missing ({why}): {LAYERS['pidns']}"]


@pytest.mark.skipif(not IS_ROOT_ON_LINUX or shutil.which("capsh") is None, reason="needs root and capsh")
def test_a_machine_that_refuses_namespaces_gives_the_reason():
    """Root without CAP_SYS_ADMIN (a container's usual lot): no network namespace and no private tmpfs, each
    with the failing system call and its error; the uid drop and Landlock stay."""
    script = textwrap.dedent("""
        import json
        from unifiedplayers.sandbox import Sandbox, SandboxConfig, isolation_report
        with Sandbox(SandboxConfig(timeout_s=5)) as sb:
            assert sb.run("print(1)").stdout == "1\\n"
            print(json.dumps(isolation_report(sb.config, sb.isolation)))
    """)
    out = subprocess.run(["capsh", "--drop=cap_sys_admin", "--", "-c", f'exec "{sys.executable}" -c "$0"', script],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["present"] == ["uid", "landlock"] and report["mechanism"] == "root"
    assert report["missing"] == {
        "netns": "unshare(CLONE_NEWNET) failed: Operation not permitted",
        "tmpfs": "working directories on disk (unshare(CLONE_NEWNS): Operation not permitted)"}


def test_the_sandbox_package_imports_nothing_of_the_project():
    package = Path(unifiedplayers.sandbox.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            ours = [n for n in names if n.split(".")[0] == "unifiedplayers"]
            assert all(n.startswith("unifiedplayers.sandbox") for n in ours), f"{path.name} imports {ours}"
