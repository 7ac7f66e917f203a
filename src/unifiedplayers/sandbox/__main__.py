"""What the sandbox gets on this machine, as this user: ``python -m unifiedplayers.sandbox`` prints the mechanism and
each layer, then tries what model-written code could do without them (docs/sandbox.md); exits 1 when an attempt
succeeded. Standard library only, so that ``PYTHONPATH=<checkout>/src python3 -m unifiedplayers.sandbox`` runs it.
"""
from __future__ import annotations

import sys

from unifiedplayers.sandbox.client import Sandbox
from unifiedplayers.sandbox.config import SandboxConfig
from unifiedplayers.sandbox.isolation import LAYERS, isolation_report

ESCAPES = {
    "TCP connection": "import socket\nsocket.create_connection(('1.1.1.1', 443), timeout=3)",
    "UDP datagram": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('1.1.1.1', 53))",
    "read /etc/passwd": "open('/etc/passwd').read()",
    "write /tmp": "open('/tmp/unifiedplayers-sandbox-probe', 'w').write('x')",
}
# Forks until refused (or 100 more than the bound), each child sleeping, and reports how many it got.
FORKS = """import os, time
n = 0
for _ in range({limit}):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    except OSError:
        break
    n += 1
print(n)
"""
def main() -> int:
    config = SandboxConfig(timeout_s=10)
    failures = []
    with Sandbox(config) as sb:
        report = isolation_report(sb.config, sb.isolation)
        print(f"mechanism: {report['mechanism']}")
        for layer in [*report["present"], *report["missing"]]:
            state = "present" if layer in report["present"] else f"MISSING ({report['missing'][layer]})"
            print(f"  {layer:8} {state}" + ("" if layer in report["present"] else f": {LAYERS[layer]}"))
        for name, code in ESCAPES.items():
            ok = sb.run(code).exit_code == 0
            print(f"{name:18} {'SUCCEEDED: not contained' if ok else 'refused'}")
            failures += [name] if ok else []
        limit = config.max_processes + 100
        got = sb.run(FORKS.format(limit=limit)).stdout.strip()
        bounded = got.isdigit() and int(got) < config.max_processes
        print(f"{'fork bomb':18} {got or '?'} processes of {limit} tried: "
              f"{'bounded' if bounded else 'NOT BOUNDED'} (max_processes {config.max_processes})")
        failures += [] if bounded else ["fork bomb"]
    print("contained" if not failures else f"NOT CONTAINED: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
