"""scripts/slurm/ on a real SLURM: a single-node cluster (munged, slurmctld, slurmd) on loopback, started by
the test in a temporary directory and stopped by process id. The CPU job is submitted with sbatch, resubmitted,
requeued mid-run with `scontrol requeue`, and sent SIGUSR1 (what `--signal` sends before the time limit); its
losses must equal an uninterrupted run's exactly (fp32 on CPU).

Needs Debian's slurm-wlm and munge (`make test` installs them as root) and root (SlurmUser=root); skipped
otherwise, saying why.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .training import ROOT, cli, free_port, small, write_corpus

pytestmark = pytest.mark.slow

CPU_JOB = ROOT / "scripts/slurm/train-cpu.sbatch"
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


def _wait_for(what: str, ready: Callable[[], object], timeout: float, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(interval)


class Cluster:
    """A running single-node SLURM; commands talk to it through SLURM_CONF in `env`."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        self.jobs: list[str] = []

    def run(self, *cmd: str | Path, **env: str) -> str:
        """stdout of a command run from the repository root, with `env` added to the environment."""
        result = subprocess.run(
            [str(c) for c in cmd],
            env={**self.env, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, f"{cmd[0]} failed: {result.stdout}{result.stderr}"
        return result.stdout

    def submit(self, script: Path, args: list[str], **env: str) -> str:
        """sbatch as users do (from the repository root; the job gets the environment, with `env`); the job's log
        goes to `log(job)`."""
        out = self.run("sbatch", "--parsable", f"--output={self.root}/job-%j.out", script, *args, **env)
        self.jobs.append(job := out.strip().split(";")[0])
        return job

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "-o", "show", "job", job)))

    def log(self, job: str) -> str:
        path = self.root / f"job-{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, job: str, timeout: float = 240) -> dict[str, str]:
        """Wait until the job is finished for good (a requeued job is pending, not finished)."""
        info: dict[str, str] = {}

        def finished() -> bool:
            info.update(self.job(job))
            return info["JobState"] in FINISHED

        _wait_for(f"job {job} to finish", finished, timeout)
        return info


def _slurm_conf(root: Path, node: str, cpus: int) -> str:
    return f"""\
ClusterName=olmorepotest
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket={root}/run/munge.socket,cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
KillWait=10
# Job ids, and so the rendezvous ports derived from them, differ between clusters started side by side.
FirstJobId={random.randrange(1, 10_000_000)}
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[Cluster]:
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        pytest.skip(
            f"SLURM is not available ({', '.join(missing)} not found): `make test` installs slurm-wlm and munge "
            "with apt-get as root (tests/system-deps.sh)"
        )
    if os.geteuid() != 0:
        pytest.skip("the test SLURM runs its daemons as root (SlurmUser=root); run the tests as root")

    # A short path: the munge socket's path must fit a unix socket address.
    root = Path(tempfile.mkdtemp(prefix="olmo-repo-slurm-"))
    for sub in ("run", "state", "spool", "log", "munge"):
        (root / sub).mkdir()
    root.chmod(0o755)
    (root / "run").chmod(0o755)  # munged: clients must be able to reach its socket
    (root / "munge").chmod(0o700)
    key = root / "munge/munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = "localhost"  # the rendezvous host the job scripts derive from the node list: resolvable anywhere
    (root / "slurm.conf").write_text(_slurm_conf(root, node, os.cpu_count() or 2))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(SLURM_CONF=str(root / "slurm.conf"), OLMo_NONINTERACTIVE="1", WANDB_MODE="offline")
    cluster = Cluster(root, env)

    daemons: list[subprocess.Popen] = []

    def start(*cmd: str) -> None:
        with open(root / f"log/{cmd[0]}.out", "w") as out:
            daemons.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))

    def wait_up(what: str, ready: Callable[[], object]) -> None:
        def logs() -> str:
            return "\n".join(f"{p.name}: {p.read_text()[-2000:]}" for p in sorted((root / "log").iterdir()))

        def check() -> object:
            for d in daemons:
                if d.poll() is not None:
                    pytest.fail(f"{d.args[0]} exited with {d.returncode}:\n{logs()}")
            return ready()

        try:
            _wait_for(what, check, 60)
        except AssertionError as e:
            pytest.fail(f"{e}\n{logs()}")

    try:
        start(
            "munged",
            "--foreground",
            f"--key-file={key}",
            f"--socket={root}/run/munge.socket",
            f"--pid-file={root}/run/munged.pid",
            f"--seed-file={root}/munge/seed",
            f"--log-file={root}/log/munged.log",
        )
        wait_up("munged", lambda: (root / "run/munge.socket").exists())
        start("slurmctld", "-D")
        wait_up("slurmctld", lambda: _quiet(env, "scontrol", "ping") is not None)
        start("slurmd", "-D", "-N", node)
        wait_up("the node to be idle", lambda: _quiet(env, "sinfo", "-h", "-o", "%T") == "idle")
        yield cluster
    finally:
        # Jobs first (their slurmstepd would outlive slurmd), then the daemons in reverse order, by process id.
        if cluster.jobs and daemons[-1].poll() is None:
            _quiet(env, "scancel", *cluster.jobs)
            jobs = ",".join(cluster.jobs)
            try:
                _wait_for(
                    "the cancelled jobs to end", lambda: _quiet(env, "squeue", "-h", "-j", jobs) == "", 60
                )
            except AssertionError:
                pass  # the daemons are stopped anyway
        for d in reversed(daemons):
            d.terminate()
            try:
                d.wait(timeout=20)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        shutil.rmtree(root, ignore_errors=True)


def _quiet(env: dict[str, str], *cmd: str) -> str | None:
    """stdout of a command that may fail (None then)."""
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    return result.stdout.strip() if result.returncode == 0 else None


def _losses(save_folder: Path) -> list[tuple[int, float]]:
    """(step, loss) of every logged step, in the order logged (a resumed run logs some steps again)."""
    records = [json.loads(line) for line in (save_folder / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/CrossEntropyLoss"]) for r in records if "train/CrossEntropyLoss" in r]


def _starts(log: str) -> list[str]:
    """The job's log cut into its starts (launch.sh opens each with 'job N, start K')."""
    return re.split(r"^.* job \d+, start \d+, ", log, flags=re.M)[1:]


def _resumed_from(start_log: str) -> int:
    found = re.findall(r"Resuming from \S*step(\d+)-unsharded", start_log)
    assert len(found) == 1, start_log[-3000:]
    return int(found[0])


def test_a_jobs_bad_input_is_one_line_before_any_node_starts(tmp_path: Path) -> None:
    """launch.sh checks the run for all its nodes first (`scripts/train.py --check`): a bad input fails the job
    with one line (no rank starts, so no traceback) and writes nothing. Run as a job's step runs it, with the
    job's variables; the check comes before anything asks SLURM (scontrol, srun)."""
    data = write_corpus(tmp_path / "data")
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2"}
    args = cli(small(data, tmp_path / "run", global_train_batch_size=6))  # 6 over 2 nodes x 2 ranks
    done = subprocess.run(
        ["bash", "scripts/slurm/launch.sh", "2", "olmo_repo/experiments/demo/configs/tiny-stage2-repo.yaml", *args],
        cwd=ROOT, env={**os.environ, **job}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1 and "job 7, start 1, nodes node[1-2]" in done.stdout
    assert done.stderr == (
        "train.py: error: config cannot train here: global_train_batch_size=6 is not divisible by the 4 ranks\n"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.long
def test_cpu_job_resubmit_requeue_and_sigusr1_continue_the_run_exactly(
    slurm: Cluster, tmp_path: Path
) -> None:
    data = write_corpus(tmp_path / "data")
    stop_at = 40
    steps = dict(max_duration=stop_at, save_interval_unsharded=8)

    def args(save_folder: Path, stop: int) -> list[str]:
        return cli(small(data, save_folder, stop_at=stop, **steps))

    # An uninterrupted run: the losses every other run must reproduce.
    reference = slurm.submit(CPU_JOB, args(tmp_path / "reference", stop_at))
    info = slurm.wait(reference)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), slurm.log(reference)[-3000:]
    expected = dict(_losses(tmp_path / "reference"))
    assert sorted(expected) == list(range(1, stop_at + 1))

    # First submission: stops at step 4 with a checkpoint. The data and save folders of this run come from the
    # environment (DATA_PREFIX, SAVE_FOLDER), the reference's from arguments.
    run = tmp_path / "run"
    folders = dict(DATA_PREFIX=str(data), SAVE_FOLDER=str(run))

    def env_args(stop: int) -> list[str]:
        return [
            a for a in args(Path("unused"), stop) if not a.startswith(("--data_prefix=", "--save_folder="))
        ]

    first = slurm.submit(CPU_JOB, env_args(4), **folders)
    info = slurm.wait(first)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), slurm.log(first)[-3000:]
    assert (run / "step4-unsharded/model.pt").is_file()
    assert [s for s, _ in _losses(run)] == [1, 2, 3, 4]

    # Resubmission: continues from step 4. Requeued mid-run (`scontrol requeue`, a kill), it continues from
    # its latest checkpoint; sent SIGUSR1, it saves a checkpoint, stops and requeues itself.
    second = slurm.submit(CPU_JOB, env_args(stop_at), **folders)
    _wait_for("a checkpoint after step 4", lambda: (run / "step8-unsharded").is_dir(), 180, interval=0.05)
    slurm.run("scontrol", "requeue", second)

    def training_again() -> bool:
        starts = _starts(slurm.log(second))
        return len(starts) == 2 and "[step=" in starts[1]

    _wait_for("the requeued job to train", training_again, 180, interval=0.1)
    slurm.run("scancel", "--signal=USR1", second)
    info = slurm.wait(second)
    log = slurm.log(second)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "2"), log[-5000:]

    starts = _starts(log)
    assert len(starts) == 3, log[-5000:]
    assert _resumed_from(starts[0]) == 4
    after_requeue = _resumed_from(starts[1])
    assert 8 <= after_requeue < stop_at
    # Every rank stops at the same step (each logs the warning).
    (stopped,) = {
        int(s) for s in re.findall(r"SIGUSR1: saving a checkpoint at step (\d+) and stopping", starts[1])
    }
    assert after_requeue < stopped < stop_at
    assert "requeueing SLURM job" in starts[1]
    assert _resumed_from(starts[2]) == stopped  # the checkpoint SIGUSR1 saved
    assert "Training complete" in starts[2]

    # Every step each start trained, and the last one, has the uninterrupted run's loss, bit for bit.
    logged = _losses(run)
    assert {s for s, _ in logged} == set(range(1, stop_at + 1))
    assert [(s, expected[s]) for s, _ in logged] == logged
    assert logged[-1] == (stop_at, expected[stop_at])


def test_prepare_data_array_job_joins_its_machines_parts(slurm: Cluster, tmp_path: Path) -> None:
    """scripts/slurm/prepare-data.sbatch as an array of 2 (two machines' parts of one folder, one after the other
    on this one node): the last part joins them, and the folder holds the documents of a run on one machine."""
    from collections import Counter

    from olmo_repo.experiments.demo import BASE_DIR

    from .prepared_data import DATA_PYTHON, documents, prepare_data, write_corpus

    if not DATA_PYTHON.is_file():
        pytest.skip("needs the data environment (.venv-data: make install-data)")
    texts = [f"Document {i}: " + "the code of apple is 123. " * (i % 7 + 1) for i in range(40)]
    write_corpus({tmp_path / "text" / f"{i}.jsonl": [{"text": t} for t in texts[i::4]] for i in range(4)})
    out = tmp_path / "out"
    slurm.submit(ROOT / "scripts/slurm/prepare-data.sbatch", [str(tmp_path / "text")],
                 MODEL=str(BASE_DIR), OUTPUT=str(out), SBATCH_ARRAY_INX="0-1")  # fmt: skip
    _wait_for("the array's join (data.json)", (out / "data.json").exists, 240)
    prepare_data(
        "--model", str(BASE_DIR), "--output", str(tmp_path / "one"), "--workers", "1", str(tmp_path / "text")
    )
    assert Counter(documents(out)) == Counter(documents(tmp_path / "one"))
    assert json.loads((out / "data.json").read_text())["documents"] == len(texts)
