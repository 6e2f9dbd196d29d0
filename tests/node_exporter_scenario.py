"""Debian's node_exporter, as its own unit runs it, scraped once over loopback.

Usage: unshare --net python -m tests.node_exporter_scenario TEXTFILE_DIR USER

In a network namespace of its own (loopback only, brought up here): starts
prometheus-node-exporter as USER with only the textfile collector, reading TEXTFILE_DIR,
listening on 127.0.0.1; fetches /metrics with urllib once it answers; stops it; prints what it
served on stdout. Its own log goes to stderr. Exits 1 if it never answered.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
ADDRESS = "127.0.0.1:9100"
STARTUP_LIMIT = 60.0  # seconds for it to answer at all: a wait, not a measurement


def main(textfile_dir: str, user: str) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    exporter = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={user}",
            f"--regid={user}",
            "--init-groups",
            NODE_EXPORTER,
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfile_dir}",
            f"--web.listen-address={ADDRESS}",
        ],
        stdout=sys.stderr,
        cwd="/",
    )
    try:
        give_up = time.monotonic() + STARTUP_LIMIT
        while True:
            try:
                with urllib.request.urlopen(f"http://{ADDRESS}/metrics", timeout=10) as reply:
                    sys.stdout.write(reply.read().decode())
                return 0
            except (urllib.error.URLError, ConnectionError):
                if exporter.poll() is not None or time.monotonic() > give_up:
                    print(f"node_exporter never answered (exit {exporter.poll()})", file=sys.stderr)
                    return 1
                time.sleep(0.1)
    finally:
        exporter.terminate()
        exporter.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
