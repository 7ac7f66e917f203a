"""The server's typed settings (``sandbox/_server/settings.py``) and the open-file limit they carry."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from unifiedplayers.sandbox import Sandbox, SandboxConfig
from unifiedplayers.sandbox._server.settings import Settings

pytestmark = pytest.mark.cpu

OPEN_MANY = "import os\nfds = []\ntry:\n    for _ in range(100):\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n" \
            "except OSError as e:\n    print(len(fds), e.strerror)\nelse:\n    print(len(fds))"


def _message(**changes) -> dict:
    message = dict(asdict(SandboxConfig()), workdir_root="/tmp/w", mirror_root="/tmp/m", uid_lock_root=None)
    message.update(changes)
    return message


def test_every_field_the_client_sends_is_read_with_its_type():
    s = Settings(_message(timeout_s=3, workers=0))
    assert s.timeout_s == 3.0 and type(s.timeout_s) is float
    assert s.workers >= 2 and s.max_open_files == 256 and s.uid_lock_root == ""
    assert set(Settings.FIELDS) >= set(asdict(SandboxConfig()))  # nothing the client sends is dropped


@pytest.mark.parametrize("changes, message", [
    ({"memory_mb": None}, "'memory_mb' is missing"),
    ({"memory_mb": "512"}, "'memory_mb' must be int, got '512'"),
    ({"network": 0}, "'network' must be bool, got 0"),
    ({"max_processes": True}, "'max_processes' must be int, got True"),
])
def test_a_malformed_setting_fails_by_name(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Settings(_message(**changes))


def test_a_malformed_setting_stops_the_server_with_its_name():
    box = Sandbox(SandboxConfig(timeout_s=5))
    box.config.max_processes = "many"  # past the client's dataclass, as a bad Hydra value would be
    with pytest.raises(Exception, match="'max_processes' must be int"):
        box.start()


def test_the_open_file_limit_is_a_setting():
    with Sandbox(SandboxConfig(timeout_s=5, max_open_files=32, workers=1)) as sb:
        count, why = sb.run(OPEN_MANY).stdout.split(" ", 1)
    assert int(count) < 32 and why.strip() == "Too many open files"
    with Sandbox(SandboxConfig(timeout_s=5, workers=1)) as sb:
        assert sb.run(OPEN_MANY).stdout == "100\n"
