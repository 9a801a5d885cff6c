"""A real single-host SLURM cluster for the test suite (Debian's slurm-wlm 22.05 + munge).

    with SlurmCluster.start_new() as cluster:      # or SlurmCluster.start_new() / .stop()
        job = cluster.sbatch("echo hi", name="t1")
        cluster.wait(job)                          # -> "COMPLETED"

What runs (all as root, no systemd, on loopback):

- ``munged`` with a key, socket, pid and log file in a private temp dir; SLURM finds the
  socket through ``AuthInfo=socket=...`` in slurm.conf.
- ``slurmctld`` and ``slurmd`` (NodeName=localhost, 127.0.0.1, free ports) as daemons with pid
  files; cgroups off (proctrack/linuxproc, task/none, jobacct_gather/none).
- No slurmdbd: ``AccountingStorageType=accounting_storage/none``, so ``sacct`` answers
  "Slurm accounting storage is disabled". Job states come from ``squeue --states=all``
  (``MinJobAge=600`` keeps finished jobs in slurmctld for 10 minutes) and every finished job is
  appended to a jobcomp/filetxt record file (``job_records()``). Snakemake's executor is told
  ``--slurm-status-command squeue`` (see docs/slurm.md).

Why the config lives at /etc/slurm/slurm.conf and not only in $SLURM_CONF: the Snakemake
jobstep strips every ``SLURM_*`` variable (SLURM_CONF included) before it calls ``srun`` inside
the allocation, so nested ``srun`` only finds the compiled-in default path. The harness writes
that file with a marker line, refuses to touch a file without the marker (a real installation),
holds a lock while the cluster lives, and removes the file on ``stop()``.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from repexp.processes import pid_alive

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT = REPO_ROOT / "workflow" / "scripts" / "install_slurm.sh"
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
LOCK_FILE = Path("/tmp/repexp-slurm-cluster.lock")
MARKER = "# written by repexp tests/slurm_cluster.py"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "srun", "scancel")
PARTITION = "cpu"
FEATURE = "repexp_test"  # every node's feature: jobs with `--constraint` (resources.<rule>.constraint) can run
TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "PREEMPTED",
}


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here; the message says why (tests skip with it)."""


def _missing_tools() -> list[str]:
    return [tool for tool in (*DAEMONS, *CLIENTS) if shutil.which(tool) is None]


def ensure_installed() -> None:
    """Install the packages with workflow/scripts/install_slurm.sh if any tool is missing."""
    missing = _missing_tools()
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"SLURM tools missing ({', '.join(missing)}) and not root, cannot apt-get install")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"SLURM tools missing ({', '.join(missing)}) and no apt-get on this machine")
    proc = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or _missing_tools():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SlurmUnavailable(
            f"could not install SLURM with {INSTALL_SCRIPT.name} (exit {proc.returncode}): " + " | ".join(tail)
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _real_memory_mb(cap_mb: int = 20000) -> int:
    """RealMemory must not exceed what slurmd detects, or the node is drained as invalid."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total_mb = int(line.split()[1]) // 1024
            return max(1000, min(cap_mb, int(total_mb * 0.9)))
    return 1000


def _pid_alive(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    # a zombie (exited, not yet reaped) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _read_pid(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _stop_pid(pid: Optional[int], expected_name: str, timeout: float = 15.0) -> None:
    """SIGTERM one daemon we started (checked by name), then SIGKILL after `timeout`."""
    if pid is None or not _pid_alive(pid) or not _process_name(pid).startswith(expected_name[:15]):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def parse_jobcomp(text: str) -> list[dict]:
    """jobcomp/filetxt lines (``JobId=1 UserId=root(0) Name=x JobState=COMPLETED ...``) -> dicts."""
    records = []
    for line in text.splitlines():
        if line.strip():
            records.append(dict(re.findall(r"(\w+)=(\S*)", line)))
    return records


@dataclass
class SlurmCluster:
    root: Path
    cpus: int = 2  # per node
    nodes: int = 1  # >1: that many slurmd on this host (n1, n2, ...), each with `cpus` CPUs, its own port
    real_memory_mb: int = field(default_factory=_real_memory_mb)
    ctld_port: int = field(default_factory=_free_port)
    slurmd_port: int = field(default_factory=_free_port)
    _lock_fd: Optional[int] = None
    _started: bool = False

    # ------------------------------------------------------------------ paths
    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge-socket" / "munge.sock"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def jobcomp_file(self) -> Path:
        return self.log_dir / "jobcomp.txt"

    @property
    def conf_path(self) -> Path:
        return SYSTEM_CONF

    def pid_file(self, daemon: str) -> Path:
        return self.root / f"{daemon}.pid"

    @property
    def node_names(self) -> list[str]:
        return ["localhost"] if self.nodes == 1 else [f"n{i}" for i in range(1, self.nodes + 1)]

    def slurmd_pid_file(self, node: str) -> Path:
        return self.pid_file("slurmd") if self.nodes == 1 else self.root / f"slurmd-{node}.pid"

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def start_new(cls, **kwargs) -> SlurmCluster:
        """Install if needed, then start a fresh cluster in a new temp dir (SlurmUnavailable if impossible)."""
        ensure_installed()
        # munged demands that every directory above its socket is world-executable, which
        # pytest's tmp_path (0700) is not: use a dedicated 0755 dir under /tmp.
        root = Path(tempfile.mkdtemp(prefix="repexp-slurm-", dir="/tmp"))
        root.chmod(0o755)
        cluster = cls(root=root, **kwargs)
        try:
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._acquire_lock()
        self._clear_stale_config()
        for sub in ("munge", "munge-socket", "log", "state", "spool", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self.node_names:
            (self.root / "spool" / node).mkdir(exist_ok=True)
        self.munge_dir.chmod(0o700)
        (self.root / "munge-socket").chmod(0o755)
        self._start_munge()
        self._write_config()
        self._start_daemon(["slurmctld", "-f", str(self.conf_path)], "slurmctld")
        self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), 30, "slurmctld to answer `scontrol ping`")
        for node in self.node_names:
            self._run_checked(["slurmd", "-f", str(self.conf_path), "-N", node], "slurmd")
            self._wait(lambda: _pid_alive(_read_pid(self.slurmd_pid_file(node)) or -1), 15, f"slurmd {node} pid file")
        self._wait(self._node_idle, 60, f"node(s) {','.join(self.node_names)} to become idle in sinfo")
        self._started = True

    def stop(self) -> None:
        """Cancel jobs, stop the daemons we started (by pid), remove the system config we wrote."""
        try:
            if _pid_alive(_read_pid(self.pid_file("slurmctld")) or -1):
                subprocess.run(["scancel", "--partition", PARTITION], env=self.env(), capture_output=True, timeout=20)
                self._wait_quietly(lambda: not self.squeue(states="RUNNING,PENDING,COMPLETING"), 30)
                subprocess.run(["scontrol", "shutdown"], env=self.env(), capture_output=True, timeout=20)
            for node in self.node_names:
                _stop_pid(_read_pid(self.slurmd_pid_file(node)), "slurmd")
            for daemon in ("slurmctld", "munged"):
                _stop_pid(_read_pid(self.pid_file(daemon)), daemon)
        finally:
            if self._owns_system_conf():
                SYSTEM_CONF.unlink(missing_ok=True)
            self._release_lock()
            self._started = False

    def remove_files(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ client helpers
    def env(self, base: Optional[dict] = None) -> dict:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def sbatch(self, command: str, name: str, *extra: str, cwd: Optional[Path] = None) -> str:
        """Submit `command` via --wrap; returns the job id. The log goes to jobs/<name>.<id>.log."""
        out = subprocess.run(
            ["sbatch", "--parsable", "-J", name, "-p", PARTITION,
             "-o", str(self.root / "jobs" / f"{name}.%j.log"), *extra, "--wrap", command],
            env=self.env(), capture_output=True, text=True, timeout=30, cwd=cwd,
        )
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout.strip().split(";")[0]

    def job_log(self, name: str, job_id: str) -> Path:
        return self.root / "jobs" / f"{name}.{job_id}.log"

    def squeue(self, name: Optional[str] = None, states: str = "all") -> dict[str, dict]:
        """Jobs known to slurmctld (finished ones stay MinJobAge = 600 s): id -> {name, state}."""
        cmd = ["squeue", "--noheader", f"--states={states}", "--format=%i|%j|%T"]
        if name:
            cmd += ["--name", name]
        out = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"squeue failed: {out.stderr.strip()}")
        jobs = {}
        for line in out.stdout.splitlines():
            job_id, job_name, state = line.strip().split("|")
            jobs[job_id] = {"name": job_name, "state": state}
        return jobs

    def release_requeued(self) -> list[str]:
        """Let requeued jobs start at once. SLURM holds a requeued job for about two minutes
        (`Reason=BeginTime`), harmless between the 24 h chunks of a real cluster but most of a
        test's time here. Returns the ids released."""
        out = subprocess.run(["squeue", "--noheader", "--states=PENDING", "--format=%i|%r"], env=self.env(),
                             capture_output=True, text=True, timeout=30)
        released = []
        for line in out.stdout.splitlines():
            job_id, reason = line.strip().split("|", 1)
            if reason == "BeginTime":
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=self.env(),
                               capture_output=True, timeout=30)
                released.append(job_id)
        return released

    def restarts(self, job_id: str) -> int:
        """How often SLURM requeued the job (scontrol's Restarts=)."""
        out = subprocess.run(["scontrol", "show", "job", job_id], env=self.env(), capture_output=True, text=True,
                             timeout=30)
        found = re.search(r"\bRestarts=(\d+)", out.stdout)
        return int(found.group(1)) if found else 0

    def job_records(self) -> list[dict]:
        """Finished jobs from the jobcomp/filetxt file (the cluster's accounting trail)."""
        if not self.jobcomp_file.exists():
            return []
        return parse_jobcomp(self.jobcomp_file.read_text())

    def wait(self, job_id: str, timeout: float = 60.0) -> str:
        """Block until the job is in a terminal state; returns that state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.squeue().get(job_id, {}).get("state")
            if state in TERMINAL_STATES:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"SLURM job {job_id} not finished after {timeout:.0f} s: {self.squeue().get(job_id)}")

    def diagnostics(self) -> str:
        """Tail of the daemon logs, for assertion messages."""
        parts = []
        for log in sorted(self.log_dir.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # ------------------------------------------------------------------ internals
    def _acquire_lock(self) -> None:
        fd = os.open(LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SlurmUnavailable(f"another test SLURM cluster is running (lock {LOCK_FILE} is held)") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _owns_system_conf(self) -> bool:
        try:
            text = SYSTEM_CONF.read_text()
        except OSError:
            return False
        return text.startswith(MARKER) and f"StateSaveLocation={self.root}/state" in text

    def _clear_stale_config(self) -> None:
        """A config of a crashed earlier harness is replaced (its daemons stopped); a foreign one is kept."""
        if not SYSTEM_CONF.exists():
            return
        text = SYSTEM_CONF.read_text(errors="replace")
        if not text.startswith(MARKER):
            self._release_lock()
            raise SlurmUnavailable(f"{SYSTEM_CONF} exists and was not written by the test harness; not touching it")
        match = re.search(r"^StateSaveLocation=(.+)/state$", text, re.M)
        if match:
            old_root = Path(match.group(1))
            for pid_file in sorted(old_root.glob("slurmd*.pid")):  # slurmd.pid, or slurmd-n1.pid, ...
                _stop_pid(_read_pid(pid_file), "slurmd", timeout=5)
            for daemon in ("slurmctld", "munged"):
                _stop_pid(_read_pid(old_root / f"{daemon}.pid"), daemon, timeout=5)
        SYSTEM_CONF.unlink()

    def _start_munge(self) -> None:
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._run_checked([
            "munged", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={self.pid_file('munged')}", f"--log-file={self.log_dir / 'munged.log'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}",
        ], "munged")
        self._wait(self.munge_socket.exists, 10, "the munge socket")

    def _write_config(self) -> None:
        root = self.root
        lines = [
            MARKER,
            "ClusterName=repexp-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={root}/state",
            # several slurmd on one host: %n (the node name) keeps their spool, pid and log apart
            f"SlurmdSpoolDir={root}/spool" + ("" if self.nodes == 1 else "/%n"),
            f"SlurmctldPidFile={self.pid_file('slurmctld')}",
            f"SlurmdPidFile={self.pid_file('slurmd')}" if self.nodes == 1 else f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd" + ("" if self.nodes == 1 else "-%n") + ".log",
            # no cgroups in a container without systemd
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            # no slurmdbd: finished jobs are kept in slurmctld (squeue) and in a jobcomp text file
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp_file}",
            "MinJobAge=600",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "ReturnToService=2",
            "MpiDefault=none",
            "DefMemPerCPU=1000",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            # SLURM's default grace between SIGTERM and SIGKILL: a preempted train job opens its node run
            # while its trainer starts (MLflow's import takes seconds on a loaded 2-core machine)
            "KillWait=30",
            *self._node_lines(),
            f"PartitionName={PARTITION} Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP",
        ]
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        tmp = SYSTEM_CONF.with_name(".slurm.conf.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(SYSTEM_CONF)

    def _node_lines(self) -> list[str]:
        if self.nodes == 1:
            return [f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.real_memory_mb} "
                    f"Features={FEATURE} State=UNKNOWN"]
        memory = self.real_memory_mb // self.nodes
        return [f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} CPUs={self.cpus} "
                f"RealMemory={memory} Features={FEATURE} State=UNKNOWN" for node in self.node_names]

    def _start_daemon(self, cmd: list[str], name: str) -> None:
        self._run_checked(cmd, name)
        self._wait(lambda: _pid_alive(_read_pid(self.pid_file(name)) or -1), 15, f"{name} pid file")

    def _run_checked(self, cmd: list[str], name: str) -> None:
        proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise SlurmUnavailable(
                f"{name} failed to start (exit {proc.returncode}): {proc.stderr.strip()[-500:]}\n{self.diagnostics()}"
            )

    def _ok(self, cmd: list[str], needle: str) -> bool:
        proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=30)
        return proc.returncode == 0 and needle in proc.stdout

    def _node_idle(self) -> bool:
        proc = subprocess.run(["sinfo", "--noheader", "-N", "-n", ",".join(self.node_names), "-o", "%T"],
                              env=self.env(), capture_output=True, text=True, timeout=30)
        states = proc.stdout.split()
        return proc.returncode == 0 and len(states) == self.nodes and set(states) == {"idle"}

    def _wait(self, predicate, timeout: float, what: str) -> None:
        if not self._wait_quietly(predicate, timeout):
            raise SlurmUnavailable(f"timed out after {timeout:.0f} s waiting for {what}\n{self.diagnostics()}")

    @staticmethod
    def _wait_quietly(predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return True
            except (OSError, subprocess.SubprocessError, RuntimeError):
                pass
            time.sleep(0.25)
        return False
