"""Every isolation property of the sandbox (Appendix D.3), each with a real escape attempt."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from unifiedplayers.sandbox import CallResult, ExecResult, Sandbox, SandboxConfig

IS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def sb():
    os.environ["UNIFIEDPLAYERS_TEST_SECRET"] = "hunter2"
    with Sandbox(SandboxConfig(timeout_s=3, memory_mb=512, max_output_bytes=2000, max_processes=8)) as box:
        yield box
    os.environ.pop("UNIFIEDPLAYERS_TEST_SECRET", None)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_run_and_call_basics(sb):
    r = sb.run("print(1+1)")
    assert isinstance(r, ExecResult)
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.memory_exceeded) == ("2\n", "", 0, False, False)
    assert r.duration_s > 0
    c = sb.call("def check(t):\n    return (t['x'] * 2, None)", "check", {"x": 21})
    assert isinstance(c, CallResult)
    assert c.ok and c.value == [42, None] and c.error is None  # JSON: the tuple comes back as a list


def test_exit_status_and_exceptions(sb):
    assert sb.run("import sys; sys.exit(3)").exit_code == 3
    r = sb.run("raise ValueError('boom')")
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr
    assert r.error is None  # the program failed, not the sandbox
    assert "_server" not in r.stderr and "unifiedplayers" not in r.stderr  # no host path leaks
    assert 'File "<sandbox>", line 1' in r.stderr
    c = sb.call("def f(p):\n    raise KeyError('nope')", "f", None)
    assert not c.ok and "KeyError" in c.error
    c = sb.call("x = 1", "check", None)
    assert not c.ok and "no function named 'check'" in c.error
    c = sb.call("def check(:\n", "check", None)
    assert not c.ok and "SyntaxError" in c.error


def test_values_cross_as_json_never_pickle(sb):
    c = sb.call("def f(p):\n    return {1, 2}", "f", None)
    assert not c.ok and "not JSON-serializable" in c.error
    c = sb.call("class A:\n    def __reduce__(self):\n        return (print, ('pwned',))\n"
                "def f(p):\n    return A()", "f", None)
    assert not c.ok and "not JSON-serializable" in c.error
    c = sb.call("def f(p):\n    return p", "f", {"a": [1, 2.5, "s", None, True]})
    assert c.ok and c.value == {"a": [1, 2.5, "s", None, True]}


def test_own_process_and_empty_working_directory_removed_afterwards(sb):
    code = "import os\nopen('mine.txt', 'w').write('x')\nprint(os.getpid(), os.getcwd(), sorted(os.listdir('.')))"
    a, b = sb.run_many([code, code])
    pid_a, cwd_a, ls_a = a.stdout.split(" ", 2)
    pid_b, cwd_b, ls_b = b.stdout.split(" ", 2)
    assert pid_a != pid_b and int(pid_a) != os.getpid()
    assert cwd_a != cwd_b
    assert ls_a.strip() == ls_b.strip() == "['mine.txt']"  # each saw only its own file
    assert not os.path.exists(cwd_a) and not os.path.exists(cwd_b)
    # A later call does not see an earlier call's file.
    assert sb.run("import os; print(os.listdir('.'))").stdout.strip() == "[]"


def test_no_network(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        r = sb.run(textwrap.dedent(f"""
            import socket
            s = socket.socket()
            s.settimeout(1)
            s.connect(("127.0.0.1", {port}))
            print("connected")
        """))
        assert r.exit_code != 0 and "connected" not in r.stdout
        r = sb.run("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                   "s.sendto(b'x', ('8.8.8.8', 53))\nprint('sent')")
        assert "sent" not in r.stdout
    finally:
        server.close()
    if sb.isolation.get("netns"):
        r = sb.run("import socket\nprint(socket.if_nameindex())")
        assert "eth" not in r.stdout and "ens" not in r.stdout  # only an unconfigured loopback


def test_no_writes_outside_working_directory(sb, tmp_path):
    target_dir = tmp_path / "open"
    target_dir.mkdir()
    os.chmod(tmp_path, 0o777)
    os.chmod(target_dir, 0o777)  # world-writable: only the sandbox itself can stop the write
    target = target_dir / "escaped.txt"
    r = sb.run(f"open({str(target)!r}, 'w').write('escaped')")
    assert r.exit_code != 0
    assert not target.exists()
    r = sb.run("import os\nos.makedirs('/tmp/unifiedplayers-escape', exist_ok=True)")
    assert r.exit_code != 0 and not os.path.exists("/tmp/unifiedplayers-escape")
    # Reading private files of the host is refused too.
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.chmod(secret, 0o644)
    r = sb.run(f"print(open({str(secret)!r}).read())")
    assert "top secret" not in r.stdout and r.exit_code != 0


def test_clean_environment(sb):
    r = sb.run("import os, json; print(json.dumps(dict(os.environ)))")
    assert "UNIFIEDPLAYERS_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout
    assert "VIRTUAL_ENV" not in r.stdout and "PYTHONPATH" not in r.stdout


def test_standard_library_only(sb):
    venv_site = [p for p in sys.path if p.endswith("site-packages")]
    for code in [
        "import numpy",
        "import unifiedplayers",
        "import torch",
        f"import sys; sys.path[:0] = {venv_site!r}; import numpy",
        f"import sys; sys.path[:0] = {[os.path.dirname(os.path.dirname(__file__))]!r}; import conftest",
    ]:
        r = sb.run(code)
        assert r.exit_code != 0, code
        assert "Error" in r.stderr
    ok = sb.run("import json, fractions, decimal, statistics, itertools, re, math\n"
                "print(fractions.Fraction(5, 2) == decimal.Decimal('2.5'))")
    assert ok.stdout == "True\n"


def test_memory_cap(sb):
    r = sb.run("x = bytearray(700 * 2**20)\nprint('allocated')")
    assert r.memory_exceeded and "allocated" not in r.stdout and r.exit_code != 0
    r = sb.run("x = bytearray(100 * 2**20)\nprint('allocated')")
    assert r.stdout == "allocated\n" and not r.memory_exceeded
    c = sb.call("def f(p):\n    return len('x' * (2**30))", "f", None)
    assert not c.ok and c.memory_exceeded


def test_timeout_kills_every_process_the_call_started(sb):
    code = textwrap.dedent("""
        import os, sys, time
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                os.setsid()          # try to leave the call's process group
                if os.fork() == 0:   # and double-fork into a daemon
                    time.sleep(60)
                    os._exit(0)
                time.sleep(60)
                os._exit(0)
        print(os.getpid(), flush=True)
        while True:
            pass
    """)
    t0 = time.monotonic()
    r = sb.run(code, timeout_s=1.0)
    assert r.timed_out and r.exit_code == -signal.SIGKILL
    assert time.monotonic() - t0 < 3.0
    time.sleep(0.1)
    if IS_ROOT:
        uids = range(sb.isolation["uid_base"], sb.isolation["uid_base"] + sb.isolation["workers"])
        assert _call_processes(uids) == []


def _call_processes(uids) -> list[int]:
    """Processes of the per-cell uids, other than each cell's long-lived sweeper."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
            uid = int(status.split("Uid:")[1].split()[0])
            ppid = int(status.split("PPid:")[1].split()[0])
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().split(")")[-1].split()[0]
        except (FileNotFoundError, IndexError, ProcessLookupError):
            continue
        if uid in uids and state != "Z":
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                parent_cmd = f.read()
            # A sweeper's parent is the server itself and it never runs user code; calls are
            # identified by their working directory instead.
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                cwd = ""
            if re.search(r"/s\d+/w$", cwd) or b"_server" not in parent_cmd:  # a cell's working dir
                found.append(int(entry))
    return found


def test_no_process_left_behind_after_a_normal_exit(sb):
    code = textwrap.dedent("""
        import os, time
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(60)
            os._exit(0)
        print(pid)
    """)
    r = sb.run(code)
    assert r.exit_code == 0
    daemon = int(r.stdout)
    # The sandbox's pid namespace is the host's, so the pid is directly checkable.
    time.sleep(0.05)
    assert not alive(daemon)


@pytest.mark.skipif(not IS_ROOT, reason="the process bound needs a per-call uid (root)")
def test_process_bound_stops_a_fork_bomb(sb):
    code = textwrap.dedent("""
        import os, time
        n = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            n += 1
        print(n)
    """)
    r = sb.run(code)
    assert r.exit_code == 0
    assert 0 < int(r.stdout) < sb.config.max_processes  # the bound, not the loop, stopped it
    assert sb.run("print('next')").stdout == "next\n"


@pytest.mark.skipif(not IS_ROOT, reason="per-call uids need root")
def test_two_servers_with_different_temp_folders_take_different_uid_blocks():
    """The uids are the machine's: servers whose working folders differ (two TMPDIRs) must not take one block, or
    each one's sweeps kill the other's calls. Both lock in client.uid_lock_root(), whatever their workdir_root."""
    from unifiedplayers.sandbox import Sandbox, SandboxConfig
    from unifiedplayers.sandbox.client import uid_lock_root

    # Two working roots the per-call uids can reach (pytest's own tmp_path lies under a 0700 folder of root's).
    roots = [tempfile.mkdtemp(prefix="up-sandbox-test-", dir="/tmp") for _ in range(2)]
    try:
        for r in roots:
            os.chmod(r, 0o755)
        with Sandbox(SandboxConfig(timeout_s=2, workdir_root=roots[0])) as one, \
                Sandbox(SandboxConfig(timeout_s=2, workdir_root=roots[1])) as two:
            r1, r2 = one.run("print(1)"), two.run("print(2)")
            assert (r1.stdout.strip(), r2.stdout.strip()) == ("1", "2"), (r1, r2)
            a, b = one.isolation["uid_base"], two.isolation["uid_base"]
            n = max(one.isolation["workers"], two.isolation["workers"])
            assert abs(a - b) >= n, (a, b)
    finally:
        for r in roots:
            shutil.rmtree(r, ignore_errors=True)
    assert uid_lock_root().endswith(f"unifiedplayers-sandbox-uids-{os.geteuid()}")


def test_uid_lock_root_refuses_a_folder_others_can_write(tmp_path):
    from unifiedplayers.sandbox.client import SandboxError, uid_lock_root

    shared = tmp_path / "shared"
    (shared / f"unifiedplayers-sandbox-uids-{os.geteuid()}").mkdir(parents=True)
    os.chmod(shared / f"unifiedplayers-sandbox-uids-{os.geteuid()}", 0o777)
    ok = tmp_path / "ok"
    ok.mkdir()
    assert uid_lock_root([str(shared), str(ok)]) == str(ok / f"unifiedplayers-sandbox-uids-{os.geteuid()}")
    with pytest.raises(SandboxError, match="no folder to lock"):
        uid_lock_root([str(shared), str(tmp_path / "missing")])


def test_stdlib_mirror_follows_symbolic_links_as_a_distribution_s_stdlib_has_them(tmp_path):
    """Debian's stdlib names _sysconfigdata__linux_*.py as a relative link to a sibling (found on the GPU image:
    the mirror held the link itself, dangling, and the server did not start) and sitecustomize.py as a link out
    of the tree; each must be mirrored as the file it names, readable, and a dangling link left out."""
    from unifiedplayers.sandbox._server.files import stdlib_mirror

    src = tmp_path / "lib" / "python3"
    (src / "lib-dynload").mkdir(parents=True)
    outside = tmp_path / "etc" / "sitecustomize.py"
    outside.parent.mkdir()
    outside.write_text("SITE = 1\n")
    outside.chmod(0o600)  # not world-readable: the mirror copies it, never chmods the installed file
    (src / "zz_sysconfigdata.py").write_text("BUILD = 'x86_64'\n")
    (src / "_sysconfigdata__linux.py").symlink_to("zz_sysconfigdata.py")  # walked before its target
    (src / "sitecustomize.py").symlink_to(outside)
    (src / "gone.py").symlink_to("nowhere.py")
    (src / "lib-dynload" / "_mod.so").write_bytes(b"\x7fELF")
    dst = stdlib_mirror(str(tmp_path / "cache"), src=str(src))
    got = {p.name: p for p in map(lambda n: tmp_path / "cache" / dst / n, os.listdir(dst))}
    assert set(got) == {"zz_sysconfigdata.py", "_sysconfigdata__linux.py", "sitecustomize.py", "lib-dynload"}
    assert not any(p.is_symlink() for p in got.values())
    assert got["_sysconfigdata__linux.py"].read_text() == "BUILD = 'x86_64'\n"
    assert got["sitecustomize.py"].read_text() == "SITE = 1\n"
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in got.values())
    assert outside.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "cache" / dst / "lib-dynload" / "_mod.so").read_bytes() == b"\x7fELF"
    assert stdlib_mirror(str(tmp_path / "cache"), src=str(src)) == dst  # built once, then reused


def test_output_is_truncated(sb):
    r = sb.run("print('a' * 100000)\nimport sys\nprint('b' * 100000, file=sys.stderr)")
    assert r.exit_code == 0
    assert len(r.stdout) == 2000 and set(r.stdout) == {"a"} and r.stdout_truncated
    assert len(r.stderr) == 2000 and r.stderr_truncated
    t0 = time.monotonic()
    r = sb.run("while True:\n    print('x' * 10000)")  # a flood is stopped, not drained for 3 s
    assert r.output_exceeded and len(r.stdout) == 2000 and time.monotonic() - t0 < 2.5


def test_host_survives_anything_the_code_does(sb):
    host = os.getpid()
    attacks = [
        f"import os, signal\nos.kill({host}, signal.SIGKILL)",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",
        "import os\nos.abort()",
        "import ctypes\nctypes.string_at(0)",
        "import sys\nsys.setrecursionlimit(10**6)\ndef f(n): return f(n+1)\nf(0)",
        "import os\nos.close(1); os.close(2); os.close(3)",
        "import os\nos.write(3, b'{\"ok\": true, \"value\": \"true\"}')\nos._exit(0)",
        "raise SystemExit('bye')",
    ]
    results = sb.run_many(attacks)
    assert len(results) == len(attacks)
    for code, r in zip(attacks, results):
        assert isinstance(r, ExecResult), code
    assert sb.run("print('still here')").stdout == "still here\n"
    assert os.getpid() == host


def test_forged_result_cannot_turn_a_program_into_a_call_value(sb):
    c = sb.call("import os\nos.write(3, b'garbage')\nos._exit(0)\ndef check(t):\n    return True", "check", {})
    assert not c.ok


def test_parallel_results_in_input_order(sb):
    codes = [f"import time\ntime.sleep({0.2 if i % 2 == 0 else 0.0})\nprint({i})" for i in range(8)]
    outs = sb.run_many(codes)
    assert [o.stdout.strip() for o in outs] == [str(i) for i in range(8)]
    calls = sb.call_many([("def f(p):\n    return p * p", "f", i) for i in range(20)])
    assert [c.value for c in calls] == [i * i for i in range(20)]


def test_concurrent_threads_share_one_sandbox(sb):
    out: dict[int, list[str]] = {}

    def work(k: int) -> None:
        out[k] = [r.stdout for r in sb.run_many([f"print({k}*{j})" for j in range(10)])]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {k: [f"{k * j}\n" for j in range(10)] for k in range(3)}


def test_server_crash_is_recovered():
    with Sandbox(SandboxConfig(timeout_s=2)) as box:
        assert box.run("print(1)").stdout == "1\n"
        box._proc.kill()  # the server itself dies (it never should)
        box._proc.wait()
        assert box.run("print(2)").stdout == "2\n"


def test_calls_die_with_a_killed_server(tmp_path):
    # Calls in flight (and what they started) must not outlive a server killed outright.
    marker = tmp_path / "pids"
    code = textwrap.dedent("""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(60)
            os._exit(0)
        print(os.getpid(), flush=True)
        time.sleep(60)
    """)
    with Sandbox(SandboxConfig(timeout_s=30, workers=2)) as box:
        pids = []

        def go():
            box.run_many([code, code])

        t = threading.Thread(target=go, daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        uids = range(box.isolation["uid_base"], box.isolation["uid_base"] + box.isolation["workers"]) \
            if IS_ROOT else range(0)
        while time.monotonic() < deadline and IS_ROOT and len(_call_processes(uids)) < 2:
            time.sleep(0.05)
        pids = _call_processes(uids) if IS_ROOT else []
        server = box._proc
        server.kill()
        server.wait()
        t.join(timeout=15)
        if IS_ROOT:
            assert len(pids) >= 2  # the running call and its setsid'd child
            time.sleep(0.3)
            assert [p for p in pids if alive(p)] == []
        assert box.run("print(3)").stdout == "3\n"


def test_isolation_layers_available_here(sb):
    iso = sb.isolation
    if IS_ROOT and sys.platform == "linux":
        assert iso["uid"] and iso["netns"]
    assert "landlock" in iso


def test_values_cross_exactly_as_json_dumps_and_loads_give_them(sb):
    # The calls encode and decode through json's C scanner and encoder directly: same text as
    # json.dumps / json.loads with their defaults, edge cases included.
    import json
    import math

    source = textwrap.dedent(r"""
        def echo(p):
            return p
        def tricky(p):
            return {1: "int key", 2.5: "float key", False: "bool key", None: "none key", "t": (1, [2, (3,)]),
                    "u": "caf\u00e9 \u2603 \U0001f600", "big": 10 ** 40, "neg": -0.0, "inf": float("inf"),
                    "nan": float("nan"), "esc": "quote\" back\\ nl\n tab\t nul\x00"}
        def circular(p):
            a = []
            a.append(a)
            return a
    """)
    payload = {"s": "\u00e9\u2603", "n": [1, 2.0, -3e300, None, True, False], "nested": {"k": [{"x": ""}]}}
    echo, tricky, circ = sb.call_many([(source, "echo", payload), (source, "tricky", None), (source, "circular", None)])
    assert echo.ok and echo.value == payload
    assert tricky.ok
    want = {"1": "int key", "2.5": "float key", "false": "bool key", "null": "none key", "t": [1, [2, [3]]],
            "u": "caf\u00e9 \u2603 \U0001f600", "big": 10 ** 40, "neg": -0.0, "inf": math.inf,
            "esc": "quote\" back\\ nl\n tab\t nul\x00"}
    got = dict(tricky.value)
    assert math.isnan(got.pop("nan")) and got == want and math.copysign(1, got["neg"]) == -1
    assert not circ.ok and "Circular reference detected" in circ.error


def test_config_from_mapping():
    box = Sandbox({"timeout_s": 1.5, "memory_mb": 256})
    assert box.config.timeout_s == 1.5 and box.config.memory_mb == 256
    with pytest.raises(TypeError):
        Sandbox({"timeout": 1})


def test_compiled_source_is_reused_but_each_call_starts_from_its_module_code(sb):
    # The cell worker compiles a source once; every call still runs its module-level code afresh.
    source = "import random\nSEEN = []\nTOKEN = random.random()\ndef check(p):\n    SEEN.append(p)\n    return [len(SEEN), TOKEN]"
    results = sb.call_many([(source, "check", i) for i in range(12)])
    assert all(r.ok for r in results)
    assert [r.value[0] for r in results] == [1] * 12  # no state carried from one call to the next
    # module code ran in each call, each from random's seed 0 (sandbox.deterministic)
    assert {r.value[1] for r in results} == {__import__("random").Random(0).random()}
    # A source that does not compile is still reported by its call, every time.
    bad = sb.call_many([("def check(p):\n    return (", "check", None)] * 3)
    assert all(not r.ok and "SyntaxError" in r.error for r in bad)


def test_literal_regular_expressions_give_the_same_answers(sb):
    source = textwrap.dedent(r'''
        import re
        def check(p):
            return [re.findall(r"-?\d+", p), bool(re.match("abc", p.upper(), re.I | re.M)),
                    re.sub(r"\s+", " ", p, flags=re.S), re.split("[,;]", p, 1)]
    ''')
    payload = "abc 12,  -3; 4"
    want = [["12", "-3", "4"], True, "abc 12, -3; 4", ["abc 12", "  -3; 4"]]
    assert [r.value for r in sb.call_many([(source, "check", payload)] * 6)] == [want] * 6


def test_literal_patterns_found_for_the_regex_cache():
    from unifiedplayers.sandbox._server import warmup

    source = ("import re\nP = re.compile(r'\\d+')\ndef f(s, q):\n    re.sub('a+', '', s, flags=re.I | re.M)\n"
              "    re.split('x', s, 0, re.S)\n    re.match(q, s)\n    re.search('b', s, flags=unknown)\n"
              "    return re.findall(b'y', s, 2)")
    found = sorted(warmup._literal_patterns(source), key=str)
    assert found == sorted([("\\d+", 0), ("a+", 2 | 8), ("x", 16), (b"y", 2)], key=str)


def test_working_directory_removed_whatever_the_call_left_in_it(sb, tmp_path):
    keep = tmp_path / "outside"
    keep.mkdir()
    (keep / "keep.txt").write_text("x")
    os.chmod(tmp_path, 0o755)
    code = textwrap.dedent(f'''
        import os
        top = os.getcwd()
        os.symlink({str(keep)!r}, "link")           # a link out of the directory: removed, not followed
        for i in range(1500):                         # deeper than any recursion limit or PATH_MAX
            os.mkdir("d"); os.chdir("d")
            if i % 300 == 0:
                open("f", "w").write("y")
        os.chdir(top)
        os.chmod("d/d", 0); os.chmod("d", 0o100)     # made unreadable by its owner
        print(top)
    ''')
    r = sb.run(code)
    assert r.exit_code == 0, r.stderr
    assert not os.path.lexists(r.stdout.strip())
    assert (keep / "keep.txt").read_text() == "x"


@pytest.mark.skipif(not IS_ROOT, reason="the private tmpfs is mounted as root only")
def test_working_directories_live_in_a_private_size_capped_tmpfs():
    code = textwrap.dedent("""
        import os
        written = 0
        try:
            for i in range(8):
                with open("f%d" % i, "wb") as f:
                    f.write(b"x" * (2 << 20))
                written += 2
        except OSError as exc:
            print("stopped", exc.errno, written, os.getcwd())
    """)
    with Sandbox(SandboxConfig(workdir_tmpfs_mb=6, max_file_mb=16)) as box:
        assert box.isolation["tmpfs"]
        r = box.run(code)
        stopped, errno_, written, cwd = r.stdout.split()
        assert (stopped, int(errno_)) == ("stopped", 28) and int(written) <= 6  # ENOSPC at the cap
        # The mount is the server's own: the host sees an empty directory where the calls' files are.
        assert not os.path.exists(cwd)
        server_view = f"/proc/{box._proc.pid}/root{cwd}"
        assert not os.path.exists(server_view)  # removed after the call, seen from inside too
        assert os.path.isdir(os.path.dirname(server_view))  # (the cell's directory is there)
        assert box.run(code).stdout.startswith("stopped 28")  # the space came back


def test_many_distinct_sources_each_run_its_own_code(sb):
    # More sources than a forker caches (64): evicted, re-sent, recompiled, never mixed up.
    items = [(f"def f(p):\n    return [{i}, p]", "f", i) for i in range(80)]
    big = "X = 0\n" + "# padding\n" * 8000 + "def f(p):\n    return ['big', p]"  # > 64 KB: not cached
    for _ in range(2):
        results = sb.call_many(items + [(big, "f", -1)] + items[::-1])
        assert [r.value for r in results] == [[i, i] for i in range(80)] + [["big", -1]] + \
            [[i, i] for i in reversed(range(80))]


# -- bad input: a dirty cell, a hostname lookup, values JSON cannot hold ----------------------

_FORK_BOMB = textwrap.dedent("""
    import os
    while True:
        try:
            os.fork()
        except OSError:
            pass
""")

# Forks as many children at once as the bound leaves a call (max_processes - 1 besides itself).
_FORKS_UP_TO_THE_BOUND = textwrap.dedent("""
    import os, time
    kids = []
    for _ in range({n}):
        pid = os.fork()
        if pid == 0:
            time.sleep(0.05)
            os._exit(0)
        kids.append(pid)
    print(sum(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) == 0 for k in kids))
""")


@pytest.mark.skipif(not IS_ROOT, reason="the process bound needs a per-cell uid (root)")
def test_cell_is_clean_for_the_next_call_after_a_fork_bomb():
    # One cell, so every call lands on the cell the bomb just ran on. The leftovers of the bomb must
    # be killed and reaped before the next call starts: its process bound is whole again.
    with Sandbox(SandboxConfig(timeout_s=5, max_processes=8, workers=1)) as box:
        innocent = _FORKS_UP_TO_THE_BOUND.format(n=box.config.max_processes - 1)
        for _ in range(3):
            bomb = box.run(_FORK_BOMB, timeout_s=1.0)
            assert bomb.timed_out
            after = [box.run(innocent) for _ in range(4)]
            assert [(r.exit_code, r.stdout) for r in after] == [(0, "7\n")] * 4, after[0].stderr[-300:]
        uids = range(box.isolation["uid_base"], box.isolation["uid_base"] + box.isolation["workers"])
        assert _call_processes(uids) == []


@pytest.mark.skipif(not IS_ROOT, reason="the forker runs under its own uid as root only")
def test_cell_is_clean_after_its_forker_dies_during_a_fork_bomb():
    # A forker killed from outside mid-bomb is replaced; its orphans must not hold the new one's bound.
    with Sandbox(SandboxConfig(timeout_s=5, max_processes=8, workers=1)) as box:
        uid = box.isolation["uid_base"]
        server = box._proc.pid
        t = threading.Thread(target=lambda: box.run(_FORK_BOMB, timeout_s=4.0), daemon=True)
        t.start()
        time.sleep(1.0)
        forkers = [p for p in _pids_of_uid(uid) if _ppid(p) == server]
        assert len(forkers) == 1
        os.kill(forkers[0], signal.SIGKILL)
        t.join(timeout=15)
        innocent = _FORKS_UP_TO_THE_BOUND.format(n=box.config.max_processes - 1)
        after = [box.run(innocent) for _ in range(4)]
        assert [(r.exit_code, r.stdout) for r in after] == [(0, "7\n")] * 4, after[0].stderr[-300:]


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(f.read().split("PPid:")[1].split()[0])
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return -1


def _pids_of_uid(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    if int(f.read().split("Uid:")[1].split()[0]) == uid:
                        found.append(int(entry))
            except (FileNotFoundError, IndexError, ProcessLookupError):
                continue
    return found


def test_hostname_lookup_fails_as_a_network_error(sb):
    code = textwrap.dedent("""
        import socket
        try:
            socket.create_connection(("example.com", 80), timeout=1)
        except OSError as exc:
            print("network error:", type(exc).__name__)
        else:
            print("connected")
    """)
    r = sb.run(code)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("network error:") and "LookupError" not in r.stderr
    # The cause: the standard library's packages loaded before the calls must find their submodules
    # (codecs among them) in the mirror the calls can read.
    r = sb.run("import codecs, json.tool\nprint('\\u00e9'.encode('cp1252'), codecs.encode('ab', 'rot13'), "
               "'b\\u00fccher.example'.encode('idna'))")
    assert r.stdout == "b'\\xe9' no b'xn--bcher-kva.example'\n", r.stderr


def test_arguments_json_cannot_hold_come_back_as_failed_results(sb):
    circular: list = []
    circular.append(circular)
    source = "def f(p):\n    return p"
    bad = [{1, 2}, b"bytes", object(), {(1, 2): "tuple key"}, circular]
    results = sb.call_many([(source, "f", p) for p in bad] + [(source, "f", [1])])
    assert all(isinstance(r, CallResult) for r in results)
    for p, r in zip(bad, results):
        assert not r.ok and r.value is None and "argument is not JSON-serializable" in r.error, (p, r.error)
    assert "Object of type set is not JSON serializable" in results[0].error
    assert results[-1].ok and results[-1].value == [1]  # the rest of the batch ran
    one = sb.call(source, "f", {3})
    assert isinstance(one, CallResult) and not one.ok and "argument is not JSON-serializable" in one.error


def test_return_values_json_cannot_hold_come_back_as_failed_results(sb):
    source = textwrap.dedent("""
        import sys
        def a_set(p):
            return {1, 2}
        def some_bytes(p):
            return b"x"
        def an_object(p):
            return object()
        def a_huge_int(p):  # encodable inside (the call lifts its own limit), not decodable in the host
            sys.set_int_max_str_digits(0)
            return 10 ** 5000
    """)
    results = sb.call_many([(source, name, None) for name in ("a_set", "some_bytes", "an_object", "a_huge_int")])
    assert all(isinstance(r, CallResult) and not r.ok and r.value is None for r in results)
    assert ["not JSON-serializable" in r.error for r in results[:3]] == [True] * 3
    assert "undecodable return value" in results[3].error


def test_text_that_cannot_cross_fails_its_own_item_only(sb):
    # A lone surrogate cannot be encoded as UTF-8: that item fails; the batch and the server go on.
    restarts = sb.restarts
    runs = sb.run_many(["print(1)", "x = '\ud800'", "print(2)"])
    assert [r.stdout for r in runs] == ["1\n", "", "2\n"]
    assert runs[1].exit_code != 0 and "cannot be sent" in runs[1].error
    calls = sb.call_many([("def f(p):\n    return p", "f", 1), ("def f(p):\n    return '\ud800'", "f", 2),
                          ("def f(p):\n    return p", "f\ud800", 3), ("def f(p):\n    return p", "f", 4)])
    assert [c.value for c in calls] == [1, None, None, 4]
    assert "cannot be sent" in calls[1].error and "cannot be sent" in calls[2].error
    assert sb.restarts == restarts
