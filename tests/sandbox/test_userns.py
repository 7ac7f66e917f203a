"""The sandbox as a user who is not root (a cluster user): every isolation layer through user namespaces.

The tests run the sandbox in a child process under a uid of no one (``setpriv``), with a copy of the sandbox
package (standard library only) and a system Python that uid can run, so they need root to start and pass on any
machine that lets an unprivileged user make user namespaces. Where root cannot make such a process (no ``setpriv``,
no Python that uid can read), they skip and say why. The fallback tests take the user namespaces away for real
(``user.max_user_namespaces`` set to 0 in a namespace of their own, or no ``/proc``) and check the reason and that
the calls still run with the layers left.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import unifiedplayers.sandbox

pytestmark = pytest.mark.cpu

USER = 60998  # a uid of no one, below the sandbox's per-cell uids (61000 and up)
SANDBOX_SRC = Path(unifiedplayers.sandbox.__file__).parent


def _runs_as_user(python: str) -> bool:
    try:
        out = subprocess.run(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", python, "-c",
                              "import os, subprocess, sys; subprocess.run([sys.executable, '-c', ''], check=True); "
                              "print(os.geteuid())"], capture_output=True, text=True, timeout=30,
                             cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == str(USER)


def _setup() -> tuple[str | None, str]:
    """(a Python that the test user can run, or None; why not)."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return None, "needs root, to start processes as another uid"
    if shutil.which("setpriv") is None:
        return None, "needs setpriv (util-linux)"
    for python in dict.fromkeys([os.path.realpath(sys.executable), "/usr/bin/python3", shutil.which("python3")]):
        if python and _runs_as_user(python):
            return python, ""
    return None, f"no Python interpreter that uid {USER} can run"


PYTHON, WHY_NOT = _setup()
needs_user = pytest.mark.skipif(PYTHON is None, reason=WHY_NOT)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of the sandbox package that the test user can read: ``<root>/unifiedplayers/sandbox``."""
    root = tmp_path_factory.mktemp("userns")
    (root / "unifiedplayers").mkdir()
    (root / "unifiedplayers" / "__init__.py").write_text("")
    shutil.copytree(SANDBOX_SRC, root / "unifiedplayers" / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    for parent in root.parents:  # pytest's base temp folder is root's own (0700)
        if parent == Path(parent.anchor) or parent.stat().st_mode & 0o005 == 0o005:
            continue
        parent.chmod(parent.stat().st_mode | 0o005)
    return root


def as_user(package: Path, script: str, wrap: list[str] = (), timeout: float = 120) -> dict:
    """Run ``script`` as the test user with the package copy on its path (``wrap``: commands run first, as root,
    that end in exec'ing the rest); its last stdout line, as JSON."""
    command = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", PYTHON, "-c",
               textwrap.dedent(script)]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package), "HOME": "/"}
    out = subprocess.run([*wrap, *command], capture_output=True, text=True, timeout=timeout, cwd="/", env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# The helpers the scripts share: the user's processes (from /proc), and a sandbox's report.
PRELUDE = """
import json, os, time
from unifiedplayers.sandbox import Sandbox, SandboxConfig, isolation_line, isolation_report

def processes():
    mine = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/status" % name) as f:
                    status = f.read()
            except OSError:
                continue
            if int(status.split("Uid:")[1].split()[0]) == os.getuid() and "State:\\tZ" not in status:
                mine.append(int(name))
    return mine

def settled(count, timeout=5.0):
    deadline = time.monotonic() + timeout
    while len(processes()) > count and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(processes())
"""

HOSTILE = {
    "tcp": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\nprint('CONNECTED')",
    "udp": "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('8.8.8.8', 53))\n"
           "print('SENT')",
    "read_outside": "print(open('/etc/hostname').read()); print('READ')",
    "write_outside": "open('/tmp/userns-escape', 'w').write('x'); print('WROTE')",
    "list_root": "import os; print(os.listdir('/')); print('LISTED')",
    # a capability left to the call would let it make a network namespace without a user namespace
    "capability": "import ctypes\nassert ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0\nprint('CAPABLE')",
    "memory": "x = bytearray(800 << 20)\nprint('ALLOCATED')",
    "file_size": "open('big', 'wb').write(b'0' * (40 << 20))\nprint('WROTE BIG')",
    "fork_bomb": "import os\nn = 0\nfor _ in range(300):\n    try:\n        pid = os.fork()\n    except OSError:\n"
                 "        break\n    if pid == 0:\n        import time\n        time.sleep(60)\n        os._exit(0)\n"
                 "    n += 1\nprint('FORKED', n)",
    "orphan": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
              "print('LEFT AN ORPHAN')",
}


@needs_user
def test_every_layer_through_a_user_namespace(package):
    """All four layers, pidns in the place of uid, and sandbox=strict starts; the positive controls run."""
    got = as_user(package, PRELUDE + """
    config = SandboxConfig(timeout_s=5, require_isolation=True)
    with Sandbox(config) as sb:
        report = isolation_report(sb.config, sb.isolation)
        run = sb.run("import os, json, math\\nopen('f.txt', 'w').write('ok')\\nprint(open('f.txt').read(), os.getuid(), "
                     "os.getpid(), math.factorial(5))")
        call = sb.call("def f(x):\\n    return {'double': 2 * x['n']}", "f", {"n": 21})
    print(json.dumps({"report": report, "line": isolation_line(report), "stdout": run.stdout, "value": call.value,
                      "uid": os.getuid()}))
    """.replace("\n    ", "\n"))
    assert got["report"] == {"mechanism": "user namespace", "present": ["netns", "pidns", "landlock", "tmpfs"],
                             "missing": {}}
    assert got["line"] == "netns, pidns, landlock, tmpfs (all layers, through a user namespace)"
    # the call runs as the user (mapped to itself), and its pid is that of its cell's namespace (the forker is 1)
    words = got["stdout"].split()
    assert words[0] == "ok" and int(words[1]) == USER == got["uid"] and 1 < int(words[2]) < 100 and words[3] == "120"
    assert got["value"] == {"double": 42}


@needs_user
def test_hostile_code_is_contained_and_the_server_keeps_answering(package):
    """Each escape fails, a fork bomb is bounded at max_processes and leaves nothing, an orphan is swept, memory and
    the file size are capped; then 140 innocent calls all answer."""
    got = as_user(package, PRELUDE + f"""
    hostile = {json.dumps(HOSTILE)}
    config = SandboxConfig(timeout_s=5, max_processes=16, memory_mb=512, max_file_mb=16)
    out = {{}}
    with Sandbox(config) as sb:
        idle = 1 + 2 * sb.isolation["workers"]  # the server, and each cell's first process and forker
        out["idle"] = settled(idle)
        for name, code in hostile.items():
            r = sb.run(code)
            out[name] = {{"stdout": r.stdout, "stderr": r.stderr[-300:], "exit_code": r.exit_code,
                          "memory_exceeded": r.memory_exceeded, "left": settled(idle) - idle}}
        answers = [sb.run("print(%d * 2)" % i).stdout for i in range(140)]
        out["innocent"] = sum(a == "%d\\n" % (2 * i) for i, a in enumerate(answers))
        out["cells"] = sb.isolation["workers"]
    out["after_close"] = settled(0)
    print(json.dumps(out))
    """.replace("\n    ", "\n"))
    for name in ("tcp", "udp", "read_outside", "write_outside", "list_root", "capability", "memory", "file_size"):
        assert got[name]["exit_code"] != 0 and got[name]["stdout"] == "", (name, got[name])
    assert "Network is unreachable" in got["udp"]["stderr"], got["udp"]
    assert "PermissionError" in got["read_outside"]["stderr"] and "PermissionError" in got["write_outside"]["stderr"]
    assert "Operation not permitted" in got["capability"]["stderr"] or "AssertionError" in got["capability"]["stderr"]
    assert got["memory"]["memory_exceeded"], got["memory"]
    assert "File too large" in got["file_size"]["stderr"], got["file_size"]
    # 16 processes at once: the call and 15 children; the 16th fork fails
    assert got["fork_bomb"]["exit_code"] == 0 and got["fork_bomb"]["stdout"] == "FORKED 15\n", got["fork_bomb"]
    assert got["orphan"]["stdout"] == "LEFT AN ORPHAN\n"
    assert all(got[name]["left"] == 0 for name in HOSTILE), {name: got[name]["left"] for name in HOSTILE}
    assert got["innocent"] == 140 and got["idle"] == 1 + 2 * got["cells"]
    assert not os.path.exists("/tmp/userns-escape")
    assert got["after_close"] == 0  # no process of the user outlives the sandbox (the script itself aside)


@needs_user
def test_the_tmpfs_caps_what_the_calls_write_together(package):
    """Working directories in the private tmpfs of workdir_tmpfs_mb: a call cannot write past it, and the next
    call finds its directory empty again."""
    got = as_user(package, """
    import json
    from unifiedplayers.sandbox import Sandbox, SandboxConfig
    fill = "n = 0\\ntry:\\n    for i in range(64):\\n        open('f%d' % i, 'wb').write(b'0' * (4 << 20)); n += 4\\n" \\
           "except OSError as e:\\n    print(n, e.strerror)"
    with Sandbox(SandboxConfig(timeout_s=5, workdir_tmpfs_mb=32, max_file_mb=16, workers=1)) as sb:
        full = sb.run(fill).stdout
        after = sb.run("import os; print(len(os.listdir('.')))").stdout
    print(json.dumps({"full": full, "after": after}))
    """.replace("\n    ", "\n"))
    mb, why = got["full"].split(" ", 1)
    assert int(mb) <= 32 and why.strip() == "No space left on device", got
    assert got["after"] == "0\n"


@needs_user
def test_the_server_dying_takes_every_call_with_it(package):
    """SIGKILL on the server: its cells' first processes die with it (PDEATHSIG), each forker with its parent, and
    every call with its forker's PID namespace, a setsid'd sleeper included."""
    got = as_user(package, PRELUDE + """
    import signal, threading
    sb = Sandbox(SandboxConfig(timeout_s=20, wall_timeout_factor=3.0))
    sb.start()
    before = len(processes())
    threading.Thread(target=sb.run, args=("import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
                                          "time.sleep(50)",), daemon=True).start()
    time.sleep(1.0)
    during = len(processes())
    os.kill(sb._proc.pid, signal.SIGKILL)
    print(json.dumps({"before": before, "during": during, "after": settled(0)}), flush=True)
    os._exit(0)
    """.replace("\n    ", "\n"))
    assert got["during"] >= got["before"] + 2, got  # the call and its setsid'd child ran
    assert got["after"] == 0, got


# Run argv[1:] in a user namespace of its own (mapped 0..65535 to itself by this process's parent, root) where
# user.max_user_namespaces is 0: no namespace can be made under it, as on a node whose admin forbids them.
NO_USER_NAMESPACES = """
import ctypes, os, sys
up_r, up_w = os.pipe()
down_r, down_w = os.pipe()
pid = os.fork()
if pid == 0:
    assert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0
    os.write(up_w, b"u")
    assert os.read(down_r, 1) == b"m"
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    os.execvp(sys.argv[1], sys.argv[1:])
assert os.read(up_r, 1) == b"u"
for name in ("uid_map", "gid_map"):
    with open("/proc/%d/%s" % (pid, name), "w") as f:
        f.write("0 0 65536")
os.write(down_w, b"m")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _fallback(package: Path, wrap: list[str]) -> dict:
    return as_user(package, """
    import json
    from unifiedplayers.sandbox import Sandbox, SandboxConfig, SandboxError, isolation_report
    with Sandbox(SandboxConfig(timeout_s=5)) as sb:
        report = isolation_report(sb.config, sb.isolation)
        ran = sb.run("print(6 * 7)").stdout
        escaped = sb.run("print(open('/etc/hostname').read())").exit_code == 0
    try:
        Sandbox(SandboxConfig(timeout_s=5, require_isolation=True)).start()
        strict = "started"
    except SandboxError as exc:
        strict = str(exc)
    print(json.dumps({"report": report, "ran": ran, "escaped": escaped, "strict": strict}))
    """.replace("\n    ", "\n"), wrap=wrap)


@needs_user
def test_without_user_namespaces_the_sandbox_falls_back_and_names_why(package):
    """user.max_user_namespaces = 0 (set in a namespace of the test's own, as a node's admin would set it for all):
    the server falls back to Landlock alone, names the failing call, and sandbox=strict refuses to start."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    got = _fallback(package, [os.path.realpath(sys.executable), "-c", NO_USER_NAMESPACES])
    report = got["report"]
    assert report["mechanism"] == "none" and report["present"] == ["landlock"], report
    assert "unshare(CLONE_NEWUSER) failed: No space left on device" in report["missing"]["uid"]
    assert "max_user_namespaces" in report["missing"]["uid"]
    assert got["ran"] == "42\n" and not got["escaped"]
    assert "isolation layers unavailable: netns, uid" in got["strict"]


@needs_user
def test_without_proc_the_user_namespace_is_left_half_way_in_its_trial_only(package):
    """No /proc: the user namespace is made but its id map cannot be written. That happens in the throw-away trial;
    the server falls back whole, with the reason, and never runs a call half isolated."""
    wrap = ["unshare", "--mount", "--propagation=private", "--", "sh", "-c", 'umount -l /proc && exec "$0" "$@"']
    got = _fallback(package, wrap)
    report = got["report"]
    assert report["mechanism"] == "none", report
    assert "writing /proc/self/setgroups: No such file or directory" in report["missing"]["uid"], report
    assert got["ran"] == "42\n" and not got["escaped"]
    assert got["strict"].startswith("sandbox server failed to start: isolation layers unavailable")


@needs_user
def test_switched_off_by_the_config(package):
    got = as_user(package, """
    import json
    from unifiedplayers.sandbox import Sandbox, SandboxConfig, isolation_report
    with Sandbox(SandboxConfig(timeout_s=5, user_namespace=False)) as sb:
        print(json.dumps(isolation_report(sb.config, sb.isolation)))
    """.replace("\n    ", "\n"))
    assert got["mechanism"] == "none" and got["present"] == ["landlock"]
    assert got["missing"]["uid"].endswith("(sandbox.user_namespace=false)")


@needs_user
def test_the_node_check_prints_every_layer_and_contained(package):
    """``python -m unifiedplayers.sandbox``, the check docs/sandbox.md gives a cluster user: the mechanism, each layer,
    and every attempt refused."""
    command = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", PYTHON, "-m", "unifiedplayers.sandbox"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/",
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package), "HOME": "/"})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "mechanism: user namespace"
    assert [line.split()[0] for line in lines[1:5]] == ["netns", "pidns", "landlock", "tmpfs"]
    assert all(line.endswith("present") for line in lines[1:5])
    assert sum(line.endswith("refused") for line in lines) == 4 and "bounded (max_processes 16)" in out.stdout
    assert lines[-1] == "contained"


@needs_user
def test_closing_during_a_call_replaces_its_cell_and_leaves_nothing(package):
    """The client goes away while a call (and a setsid'd child of it) runs: the server replaces the busy cell (its
    first process kills the forker, and with it the namespace) and exits; nothing of the user is left, and the
    server does not wait out its five-second fallback."""
    got = as_user(package, PRELUDE + """
    import threading
    sb = Sandbox(SandboxConfig(timeout_s=20, workers=2))
    sb.start()
    threading.Thread(target=sb.run, args=("import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
                                          "time.sleep(50)",), daemon=True).start()
    time.sleep(1.0)
    during = len(processes())
    t = time.monotonic()
    sb._proc.stdin.close()  # the client is gone (Sandbox.close would first wait for the running call)
    sb._proc.wait()
    print(json.dumps({"during": during, "close_s": time.monotonic() - t, "after": settled(0)}), flush=True)
    os._exit(0)
    """.replace("\n    ", "\n"))
    assert got["during"] == 1 + 2 * 2 + 2, got  # the server, two cells, the call and its child
    assert got["close_s"] < 4.0 and got["after"] == 0, got
