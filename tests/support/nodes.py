"""Several machines on one: each test node is a set of Linux namespaces (PID, mount, UTS, network)
with its own host name, address, /etc/hosts, ssh client settings and sshd, cabled (a virtual Ethernet
pair) to a bridge in a network namespace of its own, the switch; the disk (this checkout, .venv, the
test's folders) is shared, as a cluster's shared file system is. Addresses exist only inside the
nodes; nothing of the machine is changed, and killing a node's first process ends every process of that node.

Needs root, `unshare`/`nsenter`/`ip`, and sshd, ssh and pdsh (scripts/install_cluster_tools.sh);
`missing()` says what is not there, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.processes import ROOT

SUBNET = "10.231.0"  # private, made only inside the nodes' network namespaces
TOOLS = ("unshare", "nsenter", "ip", "sshd", "ssh", "ssh-keygen", "pdsh")
INIT = Path(__file__).with_name("node_init.py")


def missing() -> str | None:
    """Why nodes cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "the test nodes need root (namespaces, mounts, sshd)"
    absent = [tool for tool in TOOLS if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin") is None]
    if absent:
        return f"not installed: {', '.join(absent)} (bash scripts/install_cluster_tools.sh)"
    probe = subprocess.run(["unshare", "--net", "--mount", "--pid", "--uts", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"namespaces refused here: {probe.stderr.decode().strip()}"
    return None


class Node:
    def __init__(self, name: str, address: str, folder: Path, holder: subprocess.Popen) -> None:
        self.name, self.address, self.folder, self.holder = name, address, folder, holder
        self.pid = 0  # the node's first process as the machine sees it (`unshare --fork` runs it as its child)

    def command(self, *args: str, cwd: Path = ROOT) -> list[str]:
        """`args` run inside this node (its network, name, mounts and processes), in `cwd`."""
        return ["nsenter", "-t", str(self.pid), "--net", "--uts", "--mount", "--pid", f"--wd={cwd}", "--", *args]

    def run(self, *args: str, timeout: float = 60, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout, check=check,
                              **kwargs)

    def popen(self, *args: str, **kwargs) -> subprocess.Popen:
        """Started in a session of its own (a signal to its group reaches it alone, as a terminal's would)."""
        return subprocess.Popen(self.command(*args), start_new_session=True, **kwargs)

    def kill(self) -> None:
        """Every process of the node at once, as a machine that loses power (its first process dies)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.holder.wait(timeout=30)

    def cut_off(self) -> None:
        """Its link down: the node runs on, unreachable, as after a switch or cable fault."""
        self.run("ip", "link", "set", "eth0", "down")


class Nodes(contextlib.AbstractContextManager):
    """Two nodes, node1 and node2 at SUBNET.1 and .2, cabled to one switch, each with an sshd that
    takes the shared key from the other (root, no password: pdsh's and DeepSpeed's way in)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.nodes = folder, []
        self.switch: subprocess.Popen | None = None

    def __enter__(self) -> list[Node]:
        try:
            self._make()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.nodes

    def _make(self) -> None:
        keys = self.folder / "keys"
        keys.mkdir(parents=True)
        for path in (keys / "host", keys / "user"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        shutil.copy(keys / "user.pub", keys / "authorized_keys")
        names = ["node1", "node2"]
        hosts = "127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{i} {name}\n" for i, name in enumerate(names, 1))
        for i, name in enumerate(names, 1):
            folder = self.folder / name
            (folder / "run" / "sshd").mkdir(parents=True)
            (folder / "hosts").write_text(hosts)
            (folder / "ssh_config").write_text(
                f"Host *\n  IdentityFile {keys / 'user'}\n  StrictHostKeyChecking no\n"
                "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n")
            (folder / "sshd_config").write_text(
                f"ListenAddress {SUBNET}.{i}\nHostKey {keys / 'host'}\nAuthorizedKeysFile {keys / 'authorized_keys'}\n"
                f"PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nStrictModes no\n"
                f"PidFile {folder / 'sshd.pid'}\nAcceptEnv *\nSubsystem sftp internal-sftp\n")
            holder = subprocess.Popen(["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
                                       "--propagation", "private", sys.executable, str(INIT), name, str(folder)],
                                      cwd=ROOT, stdin=subprocess.DEVNULL, stderr=(folder / "init.log").open("w"),
                                      start_new_session=True)
            self.nodes.append(Node(name, f"{SUBNET}.{i}", folder, holder))
        deadline = time.monotonic() + 30
        for node in self.nodes:
            while not (node.folder / "ready").exists():
                if node.holder.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{node.name} did not start (exit {node.holder.poll()})")
                time.sleep(0.05)
            children = Path(f"/proc/{node.holder.pid}/task/{node.holder.pid}/children").read_text().split()
            node.pid = int(children[0])
        self._link()
        for node in self.nodes:
            node.run("/usr/sbin/sshd", "-f", str(node.folder / "sshd_config"))
        for node in self.nodes:
            for other in self.nodes:
                self._wait_for_ssh(node, other)

    def _link(self) -> None:
        """Each node's eth0 is cabled to a port of a bridge in a network namespace of its own (the
        switch): a node that dies takes its cable with it, and the others keep their links and addresses."""
        self.switch = subprocess.Popen(["unshare", "--net", "sleep", "infinity"], start_new_session=True)
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.switch.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < deadline, "the switch's namespace was not made"
            time.sleep(0.01)
        switch = ["nsenter", "-t", str(self.switch.pid), "--net", "--"]
        subprocess.run([*switch, "ip", "link", "add", "switch", "type", "bridge"], check=True)
        subprocess.run([*switch, "ip", "link", "set", "switch", "up"], check=True)
        for i, node in enumerate(self.nodes, 1):
            subprocess.run(["ip", "link", "add", "eth0", "netns", str(node.pid), "type", "veth", "peer", "name",
                            f"port{i}", "netns", str(self.switch.pid)], check=True)
            subprocess.run([*switch, "ip", "link", "set", f"port{i}", "master", "switch", "up"], check=True)
            node.run("ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
            node.run("ip", "link", "set", "eth0", "up")

    @staticmethod
    def _wait_for_ssh(node: Node, other: Node) -> None:
        deadline = time.monotonic() + 30
        while True:
            probe = node.run("ssh", other.name, "hostname", check=False, timeout=30)
            if probe.returncode == 0 and probe.stdout.strip() == other.name:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ssh {node.name} -> {other.name}: {probe.stderr.strip()}")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        for node in self.nodes:
            if node.holder.poll() is None:
                node.kill()
        if self.switch is not None:
            self.switch.kill()
            self.switch.wait(timeout=30)
