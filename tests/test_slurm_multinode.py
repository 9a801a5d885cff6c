"""Multi-node training under SLURM, as far as one host allows: two slurmd (n1, n2, one CPU each) on
this machine (tests/slurm_cluster.py with nodes=2; docs/slurm.md, "How the 2-node path was checked").

The train rule's real resources for `resources.train.nodes: 2` (common.smk `rule_resources`)
go through the real executor plugin to sbatch; the jobstep runs workflow/scripts/ray_slurm.sh in
the batch step, which starts a Ray head on n1 and a worker on n2 as job steps bound to the
allocation's CPUs, and then runs a probe where `repexp run train` would run: verl's own
`ray.init()` (no arguments, RAY_ADDRESS from the script) must see both nodes and both CPUs.
What a single host cannot show: GPU binding (no GPUs; `--gres=gpu:G` is on the srun steps only
when GPUs are requested) and cgroup confinement (the test cluster runs without cgroups).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slurm

import _reliability_fixtures as fx  # noqa: E402 (tests/ is on sys.path: tests/conftest.py)
import slurm_cluster as harness  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
import ray
ray.init(logging_level="ERROR")  # as verl's run_ppo does: RAY_ADDRESS set by ray_slurm.sh
nodes = [n for n in ray.nodes() if n["Alive"]]
json.dump({"nodes": len(nodes), "cpus": ray.cluster_resources().get("CPU", 0),
           "per_node_cpus": sorted(n["Resources"].get("CPU", 0) for n in nodes)}, open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def two_nodes():
    try:
        started = harness.SlurmCluster.start_new(nodes=2, cpus=1)
    except harness.SlurmUnavailable as err:
        pytest.skip(f"no SLURM cluster: {err}")
    yield started
    started.stop()
    started.remove_files()


def test_two_node_train_resources_start_one_ray_cluster_over_both_nodes(two_nodes, tmp_path):
    config = yaml.safe_load(fx.TEST_CONFIG.read_text())
    config["results_dir"] = str(tmp_path / "results")
    config["data"]["source"] = str((REPO / config["data"]["source"]).resolve())
    config["resources"]["train"] = {"nodes": 2, "cpus_per_task": 1, "mem_mb": 1000, "runtime": 10}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "probe.py").write_text(PROBE)
    # The real common.smk (config checks, rule_resources) with one rule that uses the train rule's resources.
    (tmp_path / "Snakefile").write_text(textwrap.dedent(f"""
        from repexp import config as C

        configfile: "config.yaml"
        PARSED_CONFIG = C.parse_files(config, workflow.configfiles)

        include: "{REPO}/workflow/rules/common.smk"

        rule ray_probe:
            output:
                "ray_probe.json",
            threads: rule_threads("train")
            resources:
                **rule_resources("train"),
            shell:
                "bash {REPO}/workflow/scripts/ray_slurm.sh {{resources.nodes}} {{resources.gpus_per_node}} {{threads}}"
                " python probe.py {{output}} > ray_probe.log 2>&1"
    """))
    env = two_nodes.env(fx.quiet_env(REPEXP_SLURM_PARTITION=harness.PARTITION))
    cmd = [fx.SNAKEMAKE, "--snakefile", str(tmp_path / "Snakefile"), "--directory", str(tmp_path),
           "--profile", str(REPO / "workflow" / "profiles" / "slurm"), "--slurm-status-command", "squeue",
           "--slurm-init-seconds-before-status-checks", "5", "--slurm-keep-successful-logs", "ray_probe.json"]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    log = tmp_path / "ray_probe.log"
    job_log = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"{fx.output_tail(proc)}\n{job_log}\n{two_nodes.diagnostics()}"
    print(f"2-node Ray probe through SLURM: {time.monotonic() - started:.0f} s")

    probe = json.loads((tmp_path / "ray_probe.json").read_text())
    assert probe == {"nodes": 2, "cpus": 2.0, "per_node_cpus": [1.0, 1.0]}, log.read_text()
    (job,) = [j for j in two_nodes.job_records() if j["Name"].startswith("repexp_")]
    assert job["JobState"] == "COMPLETED" and job["NodeList"] == "n[1-2]", job
    text = log.read_text()
    assert "head n1" in text and "workers n2" in text and "Ray ready: 2 nodes, 2 CPUs, 0 GPUs" in text
    assert "$SLURM" not in proc.stdout + proc.stderr
