"""Deployment manifests validated, not just parsed: every Kubernetes object against the API's
own schemas (kubernetes-validate, strict: an unknown field fails), the Prometheus Operator
objects against their CustomResourceDefinitions (vendored in tests/data/crds/, README there),
the PrometheusRule's rule groups by promtool, the systemd unit by systemd-analyze. Beside
each check that the shipped files pass, a broken copy of one is shown to fail it.

Everything here is offline: the schemas come from the installed kubernetes-validate package
and from tests/data/crds/."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from referencing import Registry, Resource

from driftwatch.commands import bundle
from tests.conftest import REPO, promtool_check_rules

DEPLOY = REPO / "deploy"
CRDS = REPO / "tests" / "data" / "crds"
KUBERNETES_VERSION = "1.37"
"""The Kubernetes release (major.minor) whose API schemas the manifests are checked against:
the newest that kubernetes-validate ships."""
OBJECT_META = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
"""Where kubernetes-validate's definitions file has ``metadata``'s schema, ObjectMeta, which
the API server applies to custom resources as to its own."""
DURATION = (
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
"""The Prometheus Operator CRDs' pattern of a duration, as in ``interval: 30s``."""
Manifest = dict[str, Any]


def kubernetes_objects() -> list[tuple[str, Manifest]]:
    """Every object of deploy/kubernetes/, named by file and kind."""
    found = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                found.append((f"{path.name}:{document['kind']}", document))
    return found


OBJECTS = kubernetes_objects()


def by_kind(kind: str) -> Manifest:
    (found,) = [manifest for _, manifest in OBJECTS if manifest["kind"] == kind]
    return copy.deepcopy(found)


# -- Kubernetes' own kinds, and the Prometheus Operator's against their CRDs -------------


def closed(schema: Any) -> Any:
    """A CRD's OpenAPI v3 ``schema`` as the API server applies it to a ``kubectl apply``
    (strict field validation): an object with ``properties`` takes no others unless it says
    ``x-kubernetes-preserve-unknown-fields``, ``nullable`` admits null, and a list of type
    ``set`` holds no item twice."""
    if isinstance(schema, list):
        return [closed(each) for each in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in schema:
        out["properties"] = {name: closed(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if schema.get("nullable") and "type" in schema:
        out["type"] = [schema["type"], "null"]
    if schema.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


def unique_list_map_keys(
    validator: jsonschema.protocols.Validator, keys: list[str], instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    """``x-kubernetes-list-map-keys``: no two entries of a list share their keys."""
    if not validator.is_type(instance, "array"):
        return
    seen = set()
    for item in instance:
        key = tuple(item.get(name) for name in keys) if isinstance(item, dict) else (item,)
        if key in seen:
            entry = dict(zip(keys, key, strict=False))
            yield jsonschema.ValidationError(f"duplicate entry with {entry}")
        seen.add(key)


# types-jsonschema leaves extend() unannotated.
CRDValidator: type[jsonschema.protocols.Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft4Validator, {"x-kubernetes-list-map-keys": unique_list_map_keys}
)
"""OpenAPI v3's schema objects are JSON Schema draft 4's, plus Kubernetes' extensions."""


def kubernetes_definitions() -> Resource[Any]:
    """kubernetes-validate's definitions of ``KUBERNETES_VERSION`` (ObjectMeta among them)."""
    root = files("kubernetes_validate") / "kubernetes-json-schema"
    (strict,) = [
        d
        for d in root.iterdir()
        if d.name.startswith(f"v{KUBERNETES_VERSION}.") and d.name.endswith("-local-strict")
    ]
    return Resource.from_contents(json.loads((strict / "_definitions.json").read_text()))


def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """A validator per (apiVersion, kind) of every CRD in tests/data/crds/."""
    registry: Registry[Any] = kubernetes_definitions() @ Registry()
    found = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = closed(version["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"$ref": OBJECT_META}
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            found[key] = CRDValidator(schema, registry=registry)
    return found


CRD_VALIDATORS = crd_validators()


def problems(manifest: Manifest) -> list[str]:
    """Why the API server of ``KUBERNETES_VERSION``, with the vendored CRDs installed, would
    refuse ``manifest`` (none: it would take it), one line each."""
    validator = CRD_VALIDATORS.get((manifest["apiVersion"], manifest["kind"]))
    if validator is not None:
        errors = sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.path)))
        return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [
            f"{manifest['apiVersion']} {manifest['kind']}: no schema, neither Kubernetes "
            f"{KUBERNETES_VERSION}'s nor a CRD in tests/data/crds/"
        ]
    except kubernetes_validate.ValidationError as err:
        return [f"{'.'.join(map(str, err.path))}: {err.message}"]
    return []


def test_the_manifests_hold_these_kinds() -> None:
    # A manifest that stopped being found would pass every test below unseen.
    assert sorted(name for name, _ in OBJECTS) == [
        "daemonset.yaml:DaemonSet",
        "example-training-pod.yaml:Pod",
        "prometheusrule.yaml:PrometheusRule",
        "service.yaml:Service",
        "servicemonitor.yaml:ServiceMonitor",
    ]


@pytest.mark.parametrize(("name", "manifest"), OBJECTS, ids=[name for name, _ in OBJECTS])
def test_every_object_matches_its_schema(name: str, manifest: Manifest) -> None:
    assert problems(manifest) == []


def test_the_rules_command_output_matches_the_crd() -> None:
    assert problems(yaml.safe_load(bundle.prometheus_rule().text)) == []


def test_kubernetes_schemas_reject_broken_copies() -> None:
    unknown = by_kind("DaemonSet")
    unknown["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    assert problems(unknown) == [
        "spec.template.spec.containers.0: "
        "Additional properties are not allowed ('imagePulPolicy' was unexpected)"
    ]
    wrong_type = by_kind("Service")
    wrong_type["spec"]["ports"][0]["port"] = "19461"
    assert problems(wrong_type) == ["spec.ports.0.port: '19461' is not of type 'integer'"]
    missing = by_kind("Pod")
    del missing["spec"]["containers"][0]["name"]
    assert problems(missing) == ["spec.containers.0: 'name' is a required property"]
    unknown_kind = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor"}
    assert problems(unknown_kind) == [
        f"monitoring.coreos.com/v1 PodMonitor: no schema, neither Kubernetes "
        f"{KUBERNETES_VERSION}'s nor a CRD in tests/data/crds/"
    ]


def test_crd_schemas_reject_broken_copies() -> None:
    rule = by_kind("PrometheusRule")
    rule["metadata"]["label"] = {"app": "driftwatch"}
    groups = rule["spec"]["groups"]
    groups[0]["rules"][0]["recrod"] = "job:x:sum"
    groups[1]["interval"] = "every minute"
    groups.append(copy.deepcopy(groups[2]))
    assert problems(rule) == [
        "metadata: Additional properties are not allowed ('label' was unexpected)",
        f"spec.groups: duplicate entry with {{'name': '{groups[2]['name']}'}}",
        "spec.groups.0.rules.0: Additional properties are not allowed ('recrod' was unexpected)",
        f"spec.groups.1.interval: 'every minute' does not match '{DURATION}'",
    ]
    monitor = by_kind("ServiceMonitor")
    del monitor["spec"]["selector"]
    endpoint = monitor["spec"]["endpoints"][0]
    endpoint["port"] = 19461
    endpoint["relabelings"][0]["action"] = "rename"
    monitor["spec"]["scrapeProtocols"] = ["PrometheusProto", "PrometheusProto"]
    found = problems(monitor)
    assert found[:2] == [
        "spec: 'selector' is a required property",
        "spec.endpoints.0.port: 19461 is not of type 'string'",
    ]
    assert found[2].startswith("spec.endpoints.0.relabelings.0.action: 'rename' is not one of")
    assert found[3:] == [
        "spec.scrapeProtocols: ['PrometheusProto', 'PrometheusProto'] has non-unique elements"
    ]


def check_rule_groups(promtool: str, manifest: Manifest, tmp_path: Path) -> str:
    """promtool's verdict on the rule groups of PrometheusRule ``manifest`` ("" when none)."""
    path = tmp_path / "groups.yml"
    path.write_text(yaml.safe_dump(manifest["spec"]))
    done = promtool_check_rules(promtool, path)
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_promtool_accepts_the_prometheus_rule_groups(promtool: str, tmp_path: Path) -> None:
    assert check_rule_groups(promtool, by_kind("PrometheusRule"), tmp_path) == ""


def test_promtool_rejects_broken_rule_groups(promtool: str, tmp_path: Path) -> None:
    rule = by_kind("PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum by (job) (driftwatch_step_duration"
    assert "parse error" in check_rule_groups(promtool, rule, tmp_path)


# -- the systemd unit ----------------------------------------------------------------------

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing (Debian package systemd): the unit is not verified",
)
UNIT = (DEPLOY / "systemd" / "driftwatch.service").read_text()


def verify_unit(unit: str, tmp_path: Path) -> str:
    """What ``systemd-analyze verify`` says of ``unit`` ("" when it accepts it): warnings
    too, since systemd starts a unit with an unknown or unparsable directive, ignoring it."""
    # The unit names where pip installs driftwatch; here it is this interpreter's.
    local = tmp_path / "driftwatch.service"
    local.write_text(unit.replace("/opt/driftwatch/bin", str(Path(sys.executable).parent)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(local)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stderr.strip() or (f"exit status {done.returncode}" if done.returncode else "")


@needs_systemd_analyze
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    assert (
        "\nExecStart=/opt/driftwatch/bin/driftwatch daemon --listen 0.0.0.0:19461 "
        "--db /var/lib/driftwatch/history.db\n" in UNIT
    )
    assert "\nStateDirectory=driftwatch\n" in UNIT  # /var/lib/driftwatch, writable by it alone
    assert verify_unit(UNIT, tmp_path) == ""


@needs_systemd_analyze
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("\nUMask=0077\n", "\nUMask=0077\nProtectSytem=strict\n", "Unknown key 'ProtectSytem'"),
        ("Restart=on-failure", "Restart=sometimes", "Failed to parse service restart"),
        ("ExecStart=/opt/driftwatch/bin/", "ExecStart=bin/", "Neither a valid executable name"),
    ],
)
def test_systemd_rejects_a_broken_unit(old: str, new: str, message: str, tmp_path: Path) -> None:
    assert old in UNIT
    assert message in verify_unit(UNIT.replace(old, new), tmp_path)
