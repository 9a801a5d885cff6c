"""What the Snakefile derives from its parsed config, once per Snakemake invocation, as plain Python.

    parsed config + repository root + Snakemake's workdir
      setup()          -> Pipeline: the config as jobs see it (`cfg`: paths job-relative, hub ids
                          replaced by their local copies), its snapshot path and hash, the sweep's
                          runs, the hub downloads, the SLURM settings; every check has run
      .environment()   -> the variables every job's shell reads ($REPEXP_CONFIG, offline Hub, ...)
      .resources(rule) -> the rule's scheduler requests (config `resources.<rule>` + SLURM settings)
      on_start / on_success / on_error: the workflow's hooks (intermediates, snapshot, tracking)

workflow/rules/common.smk keeps the rules' paths, targets and resources and calls this module; it is
parsed by every Snakemake invocation and every SLURM jobstep, so this module stays cheap: no MLflow,
torch or pandas import, no I/O beyond the small content sidecars of the model and data splits
(`repexp.intermediates.settle`, on the submit host).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from repexp import config as C
from repexp import gpus as G
from repexp import layout as L
from repexp.io import write_text_atomic

# The one place for cluster settings (docs/slurm.md): read from these variables of the submit
# shell, never from SLURM's own input variables (SLURM_ACCOUNT, SLURM_PARTITION, ... change what
# every interactive `srun`/`sbatch` does) and never through the profile's `$VAR` expansion (which
# leaves an unset variable in place, literally). Unset or empty: the flag is not passed and SLURM's
# defaults apply (the plugin guesses an account or submits without -A; the default partition).
SLURM_VARIABLES = {
    "account": "REPEXP_SLURM_ACCOUNT",  # -A for every job
    "partition": "REPEXP_SLURM_PARTITION",  # -p for CPU jobs (preprocess, merge, model)
    "gpu_partition": "REPEXP_SLURM_GPU_PARTITION",  # -p for jobs with resources.<rule>.gpu > 0 (train, eval)
}
# `snakemake --report` entries of the figures: (subcategory, caption file in workflow/report/) per kind
FIGURE_REPORTS = {
    "pass_at_k": ("pass@k curves", "pass_at_k.rst"),
    "testtime": ("test-time RepExp", "testtime.rst"),
    "heatmaps": ("sweep heatmaps", "heatmap.rst"),
    "training": ("training curves", "training.rst"),
    "k_efficiency": ("k-efficiency", "k_efficiency_figure.rst"),
    "dynamics": ("training dynamics", "dynamics.rst"),
}
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")


def slurm_settings(cfg: C.PipelineConfig) -> dict[str, Optional[str]]:
    """{account, partition, gpu_partition} from the environment; a bad value fails here, before any
    job, naming the variable."""
    settings = {}
    for name, variable in SLURM_VARIABLES.items():
        value = os.environ.get(variable, "").strip()
        if value and not SLURM_NAME.fullmatch(value):
            raise C.ConfigError(
                f"{variable}: {value!r} is not a SLURM account or partition name"
                + (" (an unexpanded shell variable?)" if "$" in value else "")
            )
        settings[name] = value or None
    gpu_rules = [rule for rule in C.RULES if C.rule_resources(cfg, rule).gpu > 0]
    if settings["partition"] and not settings["gpu_partition"] and gpu_rules:
        raise C.ConfigError(
            f"{SLURM_VARIABLES['gpu_partition']}: not set, but {SLURM_VARIABLES['partition']}="
            f"{settings['partition']} is, and rules {', '.join(gpu_rules)} request GPUs; set it to the GPU "
            f"partition (or to {settings['partition']} if that one has the GPUs)"
        )
    return settings


@dataclass(frozen=True)
class Pipeline:
    parsed: C.PipelineConfig  # as the user wrote it (paths relative to the repository root)
    cfg: C.PipelineConfig  # as jobs see it
    repo_root: Path
    workdir: Path
    hub_models: dict[str, str]  # local directory (job path) -> hub id, for download_model
    slurm: dict[str, Optional[str]]
    gpus: tuple[G.Gpu, ...] = ()  # the GPUs jobs share and are placed on (none: a cluster executor or no GPU)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # per-run composition

    @property
    def results(self) -> str:
        return self.cfg.results_dir

    @functools.cached_property
    def config_hash(self) -> str:
        return C.config_hash(self.cfg)

    @functools.cached_property
    def snapshot(self) -> Path:
        """The config every job reads: content-addressed, so writing it never changes a file that
        another invocation uses."""
        return self.workdir / L.config_snapshot(self.results, self.cfg.name, self.config_hash)

    @functools.cached_property
    def runs(self) -> list[C.RunSpec]:
        """The runs this invocation trains and evaluates (RunSpec objects: the sweep's, or its part's with
        `sweep.part`); their names are printed from them, never parsed back."""
        return C.part_runs(self.cfg)

    def run_pattern(self, trains: bool = False, backend: Optional[str] = None) -> str:
        """The `run` wildcard's pattern: exactly the names of the sweep's runs (of those that train, of one
        backend), so a non-canonical spelling such as b0.010 matches no rule."""
        return C.run_pattern(spec for spec in self.runs
                             if (spec.trains or not trains) and (backend is None or spec.backend == backend))

    def _cached(self, key: tuple, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def run(self, task: str, name: str) -> C.RunSpec:
        """The sweep's run of that name (ConfigError naming `run` for another name)."""
        return self._cached(("spec", task, name), lambda: C.find_run(self.cfg, task, name))

    def run_config(self, task: str, name: str) -> C.RunConfig:
        """The composed config of the sweep's run of that name."""
        return self._cached(("run", task, name),
                            lambda: C.compose(self.cfg, self.run(task, name), cfg_hash=self.config_hash))

    def job_hash(self, rule: str, **identity: str) -> str:
        """A rule's params: its job's settings hashed (repexp.jobs), so a config change reruns exactly the
        jobs whose settings changed (the shell command carries none). Train's is the training hash."""
        from repexp import jobs

        rc = self.run_config(identity["task"], identity["run"]) if "run" in identity else None
        return self._cached((rule, *sorted(identity.items())),
                            lambda: jobs.job_hash(jobs.compose(self.cfg, rule, run_config=rc, **identity)))

    def figure_files(self, report) -> list:
        """What `repexp figures` draws (repexp.layout names them): PDFs, and the PNGs marked for
        `snakemake --report` (`report`: Snakemake's function) with their caption file."""
        files = []
        for stem in L.figure_stems(self.runs):
            kind, caption = FIGURE_REPORTS[L.figure_kind(stem)]
            png = report(str(L.figure_file(self.results, stem, "png")), caption=f"../report/{caption}",
                         category="Figures", subcategory=kind, labels={"figure": stem})
            files += [str(L.figure_file(self.results, stem, "pdf")), png]
        return files

    def environment(self, python: str) -> dict[str, str]:
        """What every job's shell reads. Local jobs inherit it; SLURM jobs get it through
        `sbatch --export=ALL` and set it again when their jobstep parses common.smk."""
        return dict(
            # `repexp` from the environment that runs Snakemake (works without an activated venv;
            # with --sdm conda the rule's env is activated in front of it)
            PATH=os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
            REPEXP_CONFIG=str(self.snapshot),
            REPEXP_ROOT=str(self.repo_root),  # also expanded by pip in workflow/envs/*.yaml
            REPEXP_WORKFLOW_DIR=str(self.repo_root / "workflow"),
            # Jobs read local paths only: hub models and datasets are fetched once, on the submit host,
            # by download_model/download_data (which lift these for their own process); a job that would
            # reach for the Hub on a compute node without internet fails at once instead of hanging.
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )

    def hub_data_files(self) -> list[str]:
        """The JSONL files download_data writes: every hub table the sweep's tasks read."""
        source_hf, dapo_hf = self.parsed.data.source == "hf", self.parsed.data.dapo_source == "hf"
        if not (source_hf or dapo_hf):
            return []
        from repexp.download import data_files  # imports numpy: only for configs that download

        names = data_files(self.cfg.sweep.tasks, source_hf=source_hf, dapo_hf=dapo_hf)
        return [str(L.hub_data_dir(self.results) / name) for name in names]

    def resources(self, rule: str) -> dict:
        """Scheduler requests from config `resources.<rule>` (SLURM: --gpus[=<model>:N], -C,
        --cpus-per-task, --mem, -t) plus account and partition. Multi-node (nodes > 1): one task per
        node with the rule's CPUs and GPUs, started by the rule's own srun launcher (ray_slurm.sh)."""
        res = C.rule_resources(self.cfg, rule)
        out = dict(mem_mb=res.mem_mb, runtime=res.runtime, cpus_per_task=res.cpus_per_task, nodes=res.nodes,
                   gpus_per_node=res.gpu)  # gpus_per_node: for ray_slurm.sh's srun steps; not an sbatch flag
        if self.slurm["account"]:
            out["slurm_account"] = self.slurm["account"]
        partition = self.slurm["gpu_partition"] if res.gpu > 0 else self.slurm["partition"]
        if partition:
            out["slurm_partition"] = partition
        if res.nodes > 1:
            # --nodes=N --ntasks=N --ntasks-per-node=1 --cpus-per-task=C --gres=gpu:G: every node holds
            # C CPUs and G GPUs for its one task. `mpi` makes the jobstep run the command once in the
            # batch step (no `srun -n1` wrapper), so ray_slurm.sh can srun one Ray node per host;
            # tasks_per_gpu=0 keeps the plugin from adding --ntasks-per-gpu.
            out.update(tasks=res.nodes, mpi="srun", tasks_per_gpu=0, slurm_extra="--ntasks-per-node=1")
            if res.gpu:
                out["gres"] = f"gpu:{res.gpu_model}:{res.gpu}" if res.gpu_model else f"gpu:{res.gpu}"
        else:
            out["gpu"] = res.gpu
            if res.gpu_model:
                out["gpu_model"] = res.gpu_model  # the plugin: --gpus=<model>:<gpu>
        if res.constraint:
            out["constraint"] = res.constraint  # the plugin: -C '<features>'
        # Jobs sharing one GPU on one machine: `--resources gpu_share=100` per GPU (docs/pilot.md).
        out["gpu_share"] = share = C.gpu_share(self.cfg, rule)
        if self.places(rule):
            # one GPU each, dealt round-robin by the run's place in the sweep; a pool per GPU keeps each
            # GPU's jobs within it (`gpu_pools`)
            out["cuda_device"] = lambda wildcards: str(self.device(wildcards).index)
            for gpu in self.gpus:
                out[f"gpu{gpu.index}_share"] = self._share_on(gpu, share)
        return out

    def device(self, wildcards) -> G.Gpu:
        """The GPU a placed job runs on: its run's place among the sweep's runs, dealt round-robin."""
        names = [(spec.task, spec.name) for spec in self.runs]
        identity = (getattr(wildcards, "task", None), getattr(wildcards, "run", None))
        return G.place(names.index(identity) if identity in names else 0, self.gpus)

    def _share_on(self, gpu: G.Gpu, share: int):
        """The `gpu<i>_share` resource of a placed job: its share on its own GPU, 0 on the others."""
        return lambda wildcards: share if self.device(wildcards) == gpu else 0

    def places(self, rule: str) -> bool:
        """Whether the rule's jobs are placed on one of the host's GPUs each (CUDA_VISIBLE_DEVICES from the
        `cuda_device` resource): single-GPU jobs where the workflow read a GPU table."""
        res = C.rule_resources(self.cfg, rule)
        return bool(self.gpus) and res.gpu == 1 and res.nodes == 1

    def gpu_pools(self) -> dict[str, int]:
        """The global resources the placed jobs draw on, each GPU's at most 100 (one GPU's worth of shares)
        and `gpu_share` at most 100 per GPU; the workflow sets those not given with `--resources`."""
        if not self.gpus:
            return {}
        return {"gpu_share": 100 * len(self.gpus), **{f"gpu{gpu.index}_share": 100 for gpu in self.gpus}}

    def gpu_lines(self) -> list[str]:
        """What the workflow chose for this host's GPUs, one line per GPU rule (printed at its start)."""
        rules = [rule for rule in C.RULES if C.rule_resources(self.cfg, rule).gpu]
        if not self.gpus:
            return [f"GPUs: {G.describe(self.gpus)} read here (a cluster executor or a CPU machine): "
                    "every GPU job takes whole GPUs"] if rules else []
        lines = [f"GPUs: {G.describe(self.gpus)}; jobs placed round-robin, one GPU each"]
        caps = {"train": ("trl.gpu_memory_fraction", self.cfg.trl.gpu_memory_fraction),
                "eval": ("eval.gpu_memory_utilization", self.cfg.eval.gpu_memory_utilization)}
        for rule in rules:
            res = C.rule_resources(self.cfg, rule)
            need = f" for {res.gpu_memory_gib:g} GiB" if res.gpu_memory_gib is not None else ""
            cap = f", {caps[rule][0]} {caps[rule][1]}" if rule in caps else ""
            if rule == "train" and self.cfg.trl.rollout_engine == "vllm" and "trl" in self.cfg.sweep.backends:
                cap += f" (vLLM rollouts {C.trl_vllm_memory_utilization(self.cfg.trl):g} of the GPU)"
            lines.append(f"  {rule}: gpu_share {res.gpu_share}{need} "
                         f"({100 // int(res.gpu_share)} jobs per GPU){cap}")
        return lines


def setup(parsed: C.PipelineConfig, repo_root: Path, workdir: Path, gpus: Sequence[G.Gpu] = ()) -> Pipeline:
    """Resolve the GPU shares for `gpus` (the host's that runs the jobs; repexp.gpus), check the parsed
    config (cross-field rules, local paths, SLURM settings: ConfigError naming the key) and derive the
    job-path config from it."""
    parsed = C.resolve_gpus(parsed, gpus)
    C.check(parsed)
    C.check_paths(parsed, repo_root)
    slurm = slurm_settings(parsed)

    def from_root(path) -> Path:
        """A config path: absolute as given, else relative to the repository root (not the job's cwd)."""
        path = Path(path)
        return path if path.is_absolute() else repo_root / path

    def for_jobs(path) -> str:
        """Relative when below the workdir, so targets such as `results/eval/...` match the rules' outputs."""
        path = Path(os.path.normpath(path))
        return str(path.relative_to(workdir) if path.is_relative_to(workdir) else path)

    results = for_jobs(from_root(parsed.results_dir))
    hub_models = {}  # local copy -> hub id: download_model fetches them once, on the submit host, into results/

    def model_for_jobs(model):
        """Aliases stay (the model rule builds them); a hub id becomes its local copy (download_model);
        a local directory becomes job-relative. Jobs never see a hub id."""
        kind = None if model is None else C.model_kind(model, repo_root)
        if kind in (None, "alias"):
            return model
        if kind == "hub":
            local = str(L.hub_model_dir(results, model))
            hub_models[local] = model
            return local
        return for_jobs(from_root(os.path.expanduser(model)))

    def source_for_jobs(source, hub_dir):
        if source == "hf":
            return str(hub_dir)
        return None if source is None else os.path.relpath(from_root(source), workdir)

    data = parsed.data
    cfg = dataclasses.replace(
        parsed,
        results_dir=results,
        model=model_for_jobs(parsed.model),
        data=dataclasses.replace(data, source=source_for_jobs(data.source, L.hub_data_dir(results)),
                                 dapo_source=source_for_jobs(data.dapo_source, L.hub_dapo_dir(results))),
        bonus=dataclasses.replace(parsed.bonus, representation_model=model_for_jobs(parsed.bonus.representation_model)),
    )
    return Pipeline(parsed=parsed, cfg=cfg, repo_root=repo_root, workdir=workdir, hub_models=hub_models, slurm=slurm,
                    gpus=tuple(gpus))


# --------------------------------------------------------------------------- the workflow's hooks


def on_start(pipeline: Pipeline, workflow) -> None:
    """Before the first job of a real run (not on dry runs): the intermediates check, the config
    snapshot, the tracking server and parent runs. The check stops a run that would rerun finished
    jobs only because a deleted intermediate is rebuilt, or whose jobs would read a checkpoint or
    merged model that is gone (repexp.intermediates); not with --touch, which accepts outputs as they are."""
    from repexp import intermediates
    from repexp.tracking.workflow import on_start as start_tracking

    if not workflow.non_local_exec and not workflow.touch:  # the jobs run here: can this host run them?
        try:
            check_host(pipeline, {job.rule.name for job in workflow.dag.needrun_jobs()})
        except C.ConfigError as err:
            print(f"repexp: not starting: config error: {err}\nNo job was started.", file=sys.stderr)
            raise SystemExit(1) from None
    if not workflow.touch:
        pending = intermediates.pending_jobs(workflow.dag)
        problems = intermediates.check_pending(pending, sys.argv, workflow.dag_settings.targets)
        if problems:
            print("repexp: " + "\n  ".join(["not starting:", *problems, "No job was started."]), file=sys.stderr)
            raise SystemExit(1)
    if not pipeline.snapshot.exists():
        write_text_atomic(pipeline.snapshot, C.dump_yaml(pipeline.cfg))
    start_tracking(pipeline.snapshot, workflow.non_local_exec)


def check_host(pipeline: Pipeline, pending_rules: Collection[str]) -> None:
    """What the config asks of the host that runs the jobs, checked before the first one (not on dry runs, and
    not under a cluster executor, whose nodes are other machines): a pending TRL training with
    `trl.rollout_engine: vllm` needs a CUDA GPU here (nvidia-smi lists one) and an importable vllm
    (the jobs' Python is this one). ConfigError naming the key."""
    cfg = pipeline.cfg
    if "train" not in pending_rules or "trl" not in cfg.sweep.backends:
        return
    from repexp.trl.settings import vllm_importable

    # the table read at the start, else read now (a local run given --jobs reads none at the start)
    cuda = bool(pipeline.gpus) or bool(G.read_gpus())
    for task in cfg.sweep.tasks:
        C.check_trl_rollout_host(C.task_section(cfg, task, "trl"), cuda=cuda, vllm=vllm_importable(),
                                 where="this host (it runs the jobs)",
                                 key=lambda name, task=task: C.setting_key(cfg, task, "trl", name))


def on_end(pipeline: Pipeline, success: bool) -> None:
    """Upload what nodes left in the MLflow outbox (detached uploads under way are awaited), stop the
    tracking server this workflow started; after success, print where the results are."""
    from repexp.tracking.workflow import on_end as end_tracking
    from repexp.tracking.workflow import where_lines

    end_tracking(pipeline.snapshot, pipeline.results)
    if success:
        where = (Path(pipeline.results), L.aggregate_dir(pipeline.results), L.figures_dir(pipeline.results))
        for line in where_lines(pipeline.cfg, *(path.resolve() for path in where), config=pipeline.snapshot):
            print(line, file=sys.stderr)
