"""The first process of a test node (tests/support/nodes.py), run by `unshare` as PID 1 of the node's
own PID, mount, UTS and network namespaces: it names the node, gives it its own /etc/hosts, ssh client
settings and /run (bind mounts seen by this node only: nothing of the machine is changed), says it is
ready, then reaps orphans until it is killed, which ends every process of the node at once (the
kernel's rule for a PID namespace's first process).

    python node_init.py NAME FOLDER     (FOLDER holds hosts, ssh_config and run/ for this node)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time


def main() -> None:
    name, folder = sys.argv[1], sys.argv[2]
    socket.sethostname(name)
    for source, target in (("hosts", "/etc/hosts"), ("ssh_config", "/etc/ssh/ssh_config"), ("run", "/run")):
        subprocess.run(["mount", "--bind", os.path.join(folder, source), target], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open(os.path.join(folder, "ready.tmp"), "w") as ready:
        ready.write(str(os.getpid()))
    os.rename(os.path.join(folder, "ready.tmp"), os.path.join(folder, "ready"))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.2)


if __name__ == "__main__":
    main()
