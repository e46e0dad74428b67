"""Deployment files: every manifest parses, Prometheus accepts its configuration, the
PrometheusRule is the rule file, the objects fit together; and the two bundle commands.
Validation against schemas, and by systemd: test_manifests.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from driftwatch.channel.env import SHARED_DIR_ENV
from driftwatch.commands import bundle
from tests.conftest import REPO, run_cli

DEPLOY = REPO / "deploy"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_every_manifest_parses() -> None:
    assert len(MANIFESTS) >= 8
    for path in MANIFESTS:
        assert isinstance(load(path), dict), path


def test_prometheus_configuration_passes_promtool(promtool: str, tmp_path: Path) -> None:
    # The compose file mounts the rules at the path the configuration names; here they are
    # where the repository has them.
    config = load(DEPLOY / "compose" / "prometheus.yml")
    (mounted,) = config["rule_files"]
    config["rule_files"] = [str(DEPLOY / "prometheus" / Path(mounted).name)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [job["job_name"] for job in config["scrape_configs"]] == ["driftwatch"]


def test_compose_mounts_exist() -> None:
    compose = load(DEPLOY / "compose" / "compose.yaml")
    for service in compose["services"].values():
        for volume in service["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / "compose" / source).exists(), volume


def test_the_alertmanager_route_is_valid_and_groups_driftwatch_alerts_per_run() -> None:
    route = DEPLOY / "alertmanager" / "alertmanager.yml"
    checked = subprocess.run(
        ["amtool", "check-config", str(route)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (driftwatch,) = load(route)["route"]["routes"]
    assert driftwatch["matchers"] == ['alertname =~ "Driftwatch.*"']
    assert "run" in driftwatch["group_by"]


def test_prometheus_rule_is_generated_from_the_rule_file() -> None:
    committed = (DEPLOY / "kubernetes" / "prometheusrule.yaml").read_text()
    assert committed == bundle.prometheus_rule().text, "run: driftwatch rules --kubernetes"
    resource = yaml.safe_load(committed)
    assert resource["kind"] == "PrometheusRule"
    assert resource["spec"] == yaml.safe_load(bundle.rules().text)


def shared_dir_of(pod: dict[str, Any], container: dict[str, Any]) -> str:
    """The node directory that ``container`` of ``pod`` names in ``DRIFTWATCH_SHARED_DIR``,
    checked to be mounted where the variable says, writable."""
    env = {item["name"]: item["value"] for item in container["env"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == env[SHARED_DIR_ENV]]
    assert not mount.get("readOnly", False)
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    path: str = volume["hostPath"]["path"]
    return path


def test_daemonset_least_privileges() -> None:
    daemonset = load(DEPLOY / "kubernetes" / "daemonset.yaml")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True  # or the jobs' PIDs map to nothing (test_daemon.py)
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    (init,) = pod["initContainers"]
    args = container["args"]
    assert args[:3] == ["daemon", "--listen", "0.0.0.0:19461"]
    # The root filesystem is read-only: the history must live on a mounted volume.
    db = Path(args[args.index("--db") + 1])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (history,) = [m for m in mounts.values() if db.is_relative_to(m["mountPath"])]
    assert not history.get("readOnly", False)
    assert volumes[history["name"]]["hostPath"]["path"] == history["mountPath"]
    for each in (container, init):
        security = each["securityContext"]
        assert security["privileged"] is False
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["SYS_PTRACE", "DAC_OVERRIDE"],
    }
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "cpu" not in container["resources"]["limits"]
    assert container["resources"]["limits"]["memory"]


def test_training_pods_share_their_channels_with_the_daemon() -> None:
    pod = load(DEPLOY / "kubernetes" / "daemonset.yaml")["spec"]["template"]["spec"]
    (daemon,) = pod["containers"]
    (init,) = pod["initContainers"]
    training = load(DEPLOY / "kubernetes" / "example-training-pod.yaml")["spec"]
    (job,) = training["containers"]
    shared = shared_dir_of(pod, daemon)
    assert shared_dir_of(training, job) == shared
    assert training["securityContext"]["runAsNonRoot"] is True
    # Where ordinary users may make their private directories, as in /tmp.
    (mount,) = init["volumeMounts"]
    assert init["command"] == ["chmod", "1777", mount["mountPath"]]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == shared


def test_service_and_monitor_select_the_daemons() -> None:
    labels = load(DEPLOY / "kubernetes" / "daemonset.yaml")["spec"]["template"]["metadata"]
    service = load(DEPLOY / "kubernetes" / "service.yaml")
    monitor = load(DEPLOY / "kubernetes" / "servicemonitor.yaml")
    assert service["spec"]["selector"].items() <= labels["labels"].items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    # The Service's name is the `job` label the rules expect.
    assert service["metadata"]["name"] == "driftwatch"
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_rules_command_prints_the_rule_file() -> None:
    done = run_cli("rules")
    assert done.returncode == 0, done.stderr
    assert done.stdout == bundle.rules().text
    kubernetes = run_cli("rules", "--kubernetes")
    assert yaml.safe_load(kubernetes.stdout)["kind"] == "PrometheusRule"


def test_dashboards_command_prints_one_or_writes_all(tmp_path: Path) -> None:
    assert run_cli("dashboards", "run").stdout == bundle.dashboards()["run"].text
    done = run_cli("dashboards", "--output", str(tmp_path / "new"))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [
        "driftwatch-fleet.json",
        "driftwatch-run.json",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dashboards"], "name a dashboard to print (fleet, run), or write all with --output"),
        (["dashboards", "nope"], "no dashboard 'nope': choose one of fleet, run"),
        (["rules", "--output", "/proc/driftwatch"], "--output /proc/driftwatch: cannot write"),
    ],
)
def test_bundle_commands_fail_in_one_line(args: list[str], message: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 1
    assert done.stderr.startswith(f"driftwatch: error: {message}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
