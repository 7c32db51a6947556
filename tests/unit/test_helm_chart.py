"""The Helm chart in charts/kubeplex, rendered by Helm's own engine (no cluster, no network).

helm-python-sdk binds Helm's Go SDK (v4) through ctypes, so lint, schema validation and template
rendering here are exactly Helm's. kubernetes-validate ships the Kubernetes JSON schemas, so
every rendered object is checked offline, strictly (unknown fields are errors), against the
oldest Kubernetes the chart supports and the newest schemas shipped.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from kubeplex.core.cli import main as cli
from kubeplex.core.cli import sysctls as sysctls_command
from kubeplex.core.config.kubeproxy import parse_config
from kubeplex.core.daemon import sysctls
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.trust import parse_trust_list

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeplex"
MODES = ("iptables", "nftables", "ipvs", "ebpf", "kernelspace")
LINUX_MODES = ("iptables", "nftables", "ipvs", "ebpf")
#: The modes the image's kubeplex knows: its backends' entry points.
KNOWN_MODES = plugins.known_modes()
RELEASE = "kp"
NAMESPACE = "kube-system"
FULLNAME = "kp-kubeplex"
# The chart's kubeVersion floor (or the oldest schemas shipped, if newer) and the newest shipped.
_SHIPPED = kubernetes_validate.utils.all_versions()
KUBE_VERSIONS = (
    next(v for v in _SHIPPED if tuple(map(int, v.split("."))) >= (1, 26, 0)),
    _SHIPPED[-1],
)
CONFIG_PATH = "/var/lib/kubeplex/config.conf"

# Everything optional switched on, to validate the objects only rendered on request.
EVERYTHING = {
    "metrics": {
        "bindAddress": "0.0.0.0",
        "service": {"enabled": True, "annotations": {"prometheus.io/scrape": "true"}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    },
    "config": {
        "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56",
        "nodePortAddresses": ["192.168.0.0/16"],
        "iptables": {"masqueradeAll": True, "syncPeriod": "1m", "minSyncPeriod": "2s"},
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "12h"},
        "extra": {"detectLocalMode": "NodeCIDR", "logging": {"format": "json"}},
    },
    "sysctlInit": {"extraSysctls": {"net.ipv4.ip_forward": 1}},
    "imagePullSecrets": [{"name": "regcred"}],
    "extraArgs": ["--cluster-cidr=10.244.0.0/16"],
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "extraVolumes": [{"name": "certs", "hostPath": {"path": "/etc/pki", "type": "Directory"}}],
    "extraVolumeMounts": [{"name": "certs", "mountPath": "/etc/pki", "readOnly": True}],
    "nodeSelector": {"node-role.kubernetes.io/worker": ""},
    "podAnnotations": {"example.com/owner": "net"},
    "podLabels": {"tier": "node"},
    "resources": {"requests": {"cpu": "50m"}, "limits": {"memory": "512Mi"}},
    "serviceAccount": {"annotations": {"example.com/role": "proxy"}},
    "updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%"}},
}


# --- helpers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render_files(chart: helm.Chart, values: dict[str, Any] | None = None) -> dict[str, str]:
    return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every rendered object, in template order, as `helm template` prints them."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(render_files(chart, values).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (proxy,) = pod_spec(objects)["containers"]
    assert proxy["name"] == "kubeplex"
    return dict(proxy)


def config_text(objects: list[dict[str, Any]]) -> str:
    text: str = only(objects, "ConfigMap")["data"]["config.conf"]
    return text


def schema_error(chart: helm.Chart, values: dict[str, Any]) -> str:
    """The schema's complaint about ``values``: validate_schema and render must both refuse."""
    with pytest.raises(helm.HelmValuesError) as validated:
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError) as rendered:
        render_files(chart, values)
    assert "schema" in str(rendered.value)
    return str(validated.value)


# --- the chart as a package ----------------------------------------------------------------


def test_chart_metadata_matches_the_project() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "kubeplex"
    assert meta["type"] == "application"
    assert meta["appVersion"] == project["version"] == "0.1.0"
    for name in ("values.yaml", "values.schema.json", "README.md", ".helmignore"):
        assert (CHART / name).is_file(), name


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
@pytest.mark.parametrize("mode", MODES)
def test_helm_lint_is_clean(mode: str, values: dict[str, Any]) -> None:
    report = helm.lint(
        CHART, {**values, "mode": mode}, strict=True, namespace=NAMESPACE, kube_version="v1.26.0"
    )
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_helm_lint_reports_bad_values() -> None:
    report = helm.lint(CHART, {"mode": "userspace"}, namespace=NAMESPACE)
    assert any("/mode" in error for error in report["errors"])


# --- rendering and the Kubernetes schemas ------------------------------------------------


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
@pytest.mark.parametrize("mode", MODES)
def test_every_manifest_is_valid_kubernetes(
    chart: helm.Chart, mode: str, values: dict[str, Any]
) -> None:
    objects = render(chart, {**values, "mode": mode})
    kinds = sorted(o["kind"] for o in objects)
    expected = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
    if values:
        expected += ["Service", "ServiceMonitor"]
    assert kinds == sorted(expected)
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            continue  # a prometheus-operator CRD: no Kubernetes schema; checked below
        validate(obj)


def validate(obj: dict[str, Any]) -> None:
    """Fail unless ``obj`` is valid, strictly, for the oldest and the newest Kubernetes."""
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']} invalid for Kubernetes {version}: {where}: {err}")


def test_validation_catches_a_broken_manifest(chart: helm.Chart) -> None:
    """The schemas are strict: the test above would see an unknown or mistyped field."""
    daemonset = only(render(chart), "DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBE_VERSIONS[-1], strict=True)


# --- the KubeProxyConfiguration ------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_configmap_loads_with_kubeplex_config_loader(chart: helm.Chart, mode: str) -> None:
    objects = render(chart, {"mode": mode})
    text = config_text(objects)
    cfg = parse_config(text, "configmap", known_modes=KNOWN_MODES)
    assert cfg.mode == mode
    assert cfg.healthz_bind_address == "0.0.0.0:10256"
    assert cfg.metrics_bind_address == "127.0.0.1:10249"  # upstream's default, kept
    # Only what the chart must set is written; every other field keeps upstream's default.
    assert set(yaml.safe_load(text)) == {
        "apiVersion",
        "kind",
        "mode",
        "healthzBindAddress",
        "metricsBindAddress",
    }
    # The DaemonSet reads exactly this ConfigMap at the path it passes to --config.
    spec = pod_spec(objects)
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == only(objects, "ConfigMap")["metadata"]["name"]
    assert mounts["config"]["mountPath"] == str(Path(CONFIG_PATH).parent)
    assert mounts["config"]["readOnly"] is True
    assert f"--config={CONFIG_PATH}" in container(objects)["args"]


def test_configmap_carries_the_values(chart: helm.Chart) -> None:
    values = {
        "mode": "ipvs",
        "config": {
            "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56",
            "bindAddress": "::",
            "nodePortAddresses": ["192.168.0.0/16", "fd00::/64"],
            "iptables": {"masqueradeBit": 15},
            "ipvs": {
                "scheduler": "wrr",
                "strictARP": True,
                "excludeCIDRs": ["10.0.0.0/8"],
                "syncPeriod": "1m",
                "tcpTimeout": "900s",
            },
            "conntrack": {"maxPerCore": 0, "min": 262144, "tcpBeLiberal": True},
            "extra": {
                "detectLocalMode": "NodeCIDR",
                "featureGates": {"ExampleGate": True},
                "configSyncPeriod": "30m",
                "oomScoreAdj": -500,
            },
        },
        "healthz": {"bindAddress": "::", "port": 10266},
        "metrics": {"bindAddress": "::1", "port": 10259},
    }
    objects = render(chart, values)
    cfg = parse_config(config_text(objects), "configmap", known_modes=KNOWN_MODES)
    assert cfg.mode == "ipvs"
    assert [str(n) for n in cfg.cluster_cidrs] == ["10.244.0.0/16", "fd00:10:244::/56"]
    assert cfg.bind_address == "::"
    assert cfg.healthz_bind_address == "[::]:10266"
    assert cfg.metrics_bind_address == "[::1]:10259"
    assert cfg.node_port_addresses == ("192.168.0.0/16", "fd00::/64")
    assert cfg.iptables.masquerade_bit == 15
    assert cfg.ipvs.scheduler == "wrr"
    assert cfg.ipvs.strict_arp is True
    assert [str(n) for n in cfg.ipvs.exclude_cidrs] == ["10.0.0.0/8"]
    assert (cfg.ipvs.sync_period, cfg.ipvs.min_sync_period) == (60.0, 0.0)
    assert cfg.ipvs.tcp_timeout == 900.0
    assert (cfg.conntrack.max_per_core, cfg.conntrack.min) == (0, 262144)
    assert cfg.conntrack.tcp_be_liberal is True
    assert cfg.detect_local_mode == "NodeCIDR"
    assert dict(cfg.feature_gates) == {"ExampleGate": True}
    assert cfg.config_sync_period == 1800.0
    assert cfg.oom_score_adj == -500
    # Untouched sections keep upstream defaults.
    assert cfg.nftables.sync_period == 30.0
    assert cfg.conntrack.tcp_established_timeout == 24 * 3600.0
    # The ports follow the bind addresses.
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert ports == {"healthz": 10266, "metrics": 10259}


def test_nftables_gets_upstream_nodeport_default(chart: helm.Chart) -> None:
    objects = render(chart, {"mode": "nftables"})
    cfg = parse_config(config_text(objects), "configmap", known_modes=KNOWN_MODES)
    assert cfg.node_port_addresses == ("primary",)


def test_config_checksum_rolls_the_daemonset(chart: helm.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        files = render_files(chart, values)
        daemonset = yaml.safe_load(files["kubeplex/templates/daemonset.yaml"])
        annotation: str = daemonset["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"
        ]
        configmap = files["kubeplex/templates/configmap.yaml"]
        assert annotation == hashlib.sha256(configmap.encode()).hexdigest()
        return annotation

    base = checksum({})
    assert checksum({}) == base
    assert checksum({"mode": "nftables"}) != base
    assert checksum({"config": {"iptables": {"masqueradeAll": True}}}) != base
    # Something that is not configuration does not roll the pods through the checksum.
    assert checksum({"logVerbosity": 2}) == base


# --- values.schema.json ----------------------------------------------------------------------


def test_unknown_mode_is_rejected(chart: helm.Chart) -> None:
    message = schema_error(chart, {"mode": "userspace"})
    assert "/mode" in message
    for mode in MODES:
        assert f"'{mode}'" in message


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"mdoe": "nftables"}, "mdoe"),
        ({"mode": ""}, "/mode"),
        ({"mode": None}, "mode"),  # null deletes the key: missing
        ({"config": {"iptables": {"syncPeriod": 30}}}, "/config/iptables/syncPeriod"),
        ({"config": {"iptables": {"syncPeriod": "30 seconds"}}}, "/config/iptables/syncPeriod"),
        ({"config": {"iptables": {"masqueradeBit": 32}}}, "/config/iptables/masqueradeBit"),
        ({"config": {"iptables": {"masqueradeBitt": 14}}}, "masqueradeBitt"),
        ({"config": {"nftables": {"masqueradeAll": "yes"}}}, "/config/nftables/masqueradeAll"),
        ({"config": {"ipvs": {"scheduler": "fastest"}}}, "/config/ipvs/scheduler"),
        ({"config": {"conntrack": {"maxPerCore": -1}}}, "/config/conntrack/maxPerCore"),
        ({"config": {"winkernel": {"enableDSR": "true"}}}, "/config/winkernel/enableDSR"),
        ({"config": {"clusterCIDR": "10.244.0.0"}}, "/config/clusterCIDR"),
        ({"config": {"nodePortAddresses": ["eth0"]}}, "/config/nodePortAddresses/0"),
        ({"config": {"bindAddress": "localhost"}}, "/config/bindAddress"),
        ({"config": {"extra": {"mode": "ipvs"}}}, "mode"),
        ({"config": {"extra": {"detectLocalMode": "Magic"}}}, "/config/extra/detectLocalMode"),
        ({"healthz": {"port": 0}}, "/healthz/port"),
        ({"metrics": {"port": 70000}}, "/metrics/port"),
        ({"metrics": {"bindAddress": "any"}}, "/metrics/bindAddress"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"command": []}, "/command"),
        ({"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}}, "maxUnavailable"),
        ({"updateStrategy": {"rollingUpdate": {"maxUnavailable": "0%"}}}, "maxUnavailable"),
        ({"livenessProbe": {"httpGet": {"path": "/"}}}, "httpGet"),
        ({"securityContext": {"privileged": "no"}}, "/securityContext/privileged"),
        ({"nodeSelector": {"zone": 1}}, "/nodeSelector/zone"),
        ({"apiServer": {"host": "https://cp.example.com"}}, "/apiServer/host"),
        ({"apiServer": {"host": "cp.example.com:6443"}}, "/apiServer/host"),
        ({"apiServer": {"host": "[fd00::10]"}}, "/apiServer/host"),
        ({"apiServer": {"port": 0}}, "/apiServer/port"),
        ({"apiServer": {"hots": "cp"}}, "hots"),
        ({"extraVolumes": [{"hostPath": {"path": "/x"}}]}, "/extraVolumes/0"),
        ({"extraVolumeMounts": [{"name": "x"}]}, "/extraVolumeMounts/0"),
    ],
)
def test_malformed_values_are_rejected(
    chart: helm.Chart, values: dict[str, Any], where: str
) -> None:
    assert where in schema_error(chart, values)


def test_schema_accepts_what_the_readme_shows(chart: helm.Chart) -> None:
    example = {
        "mode": "ipvs",
        "config": {
            "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56",
            "nodePortAddresses": ["192.168.0.0/16"],
            "ipvs": {"scheduler": "wrr", "strictARP": True},
            "conntrack": {"maxPerCore": 0},
            "extra": {"detectLocalMode": "NodeCIDR", "logging": {"format": "json"}},
        },
    }
    chart.validate_schema(example)
    chart.validate_schema(EVERYTHING)
    chart.validate_schema({"config": {"nodePortAddresses": ["primary"]}})


def test_loopback_metrics_cannot_get_a_service(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"metrics\.bindAddress off loopback"):
        render_files(chart, {"metrics": {"service": {"enabled": True}}})
    with pytest.raises(helm.HelmRenderError, match=r"needs metrics\.service\.enabled"):
        render_files(
            chart, {"metrics": {"bindAddress": "0.0.0.0", "serviceMonitor": {"enabled": True}}}
        )


# --- RBAC --------------------------------------------------------------------------------------


def test_rbac_grants_exactly_what_kubeplex_uses(chart: helm.Chart) -> None:
    objects = render(chart)
    role = only(objects, "ClusterRole")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    assert granted == {
        ("", "services", "list"),
        ("", "services", "watch"),
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("networking.k8s.io", "servicecidrs", "list"),
        ("networking.k8s.io", "servicecidrs", "watch"),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
    }
    binding = only(objects, "ClusterRoleBinding")
    account = only(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert pod_spec(objects)["serviceAccountName"] == account["metadata"]["name"] == FULLNAME


def test_rbac_and_service_account_can_be_left_out(chart: helm.Chart) -> None:
    objects = render(
        chart, {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "proxy"}}
    )
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "DaemonSet"]
    assert pod_spec(objects)["serviceAccountName"] == "proxy"


# --- the DaemonSet -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_daemonset_runs_on_every_node(chart: helm.Chart, mode: str) -> None:
    objects = render(chart, {"mode": mode})
    daemonset = only(objects, "DaemonSet")
    spec = pod_spec(objects)
    os_name = "windows" if mode == "kernelspace" else "linux"
    assert daemonset["metadata"]["namespace"] == NAMESPACE
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["nodeSelector"] == {"kubernetes.io/os": os_name}
    assert spec["os"] == {"name": os_name}

    proxy = container(objects)
    assert proxy["image"] == "ghcr.io/kubeplex/kubeplex:0.1.0"
    assert proxy["imagePullPolicy"] == "IfNotPresent"
    assert proxy["command"] == ["kubeplex"]
    assert proxy["args"][:3] == [
        "run",
        f"--config={CONFIG_PATH}",
        "--hostname-override=$(NODE_NAME)",
    ]
    env = {e["name"]: e for e in proxy["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    ports = {p["name"]: p for p in proxy["ports"]}
    assert ports["healthz"]["containerPort"] == 10256
    assert ports["metrics"]["containerPort"] == 10249
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "healthz"}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert proxy["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}


@pytest.mark.parametrize("mode", LINUX_MODES)
def test_linux_mounts(chart: helm.Chart, mode: str) -> None:
    objects = render(chart, {"mode": mode})
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    assert volumes["xtables-lock"]["hostPath"] == {
        "path": "/run/xtables.lock",
        "type": "FileOrCreate",
    }
    assert mounts["xtables-lock"]["mountPath"] == "/run/xtables.lock"
    assert not mounts["xtables-lock"].get("readOnly", False)  # iptables takes the lock
    if mode != "ipvs":
        # Only ipvs loads kernel modules: a node without /lib/modules runs the other modes.
        assert "lib-modules" not in volumes and "lib-modules" not in mounts
        return
    # No type, as kubeadm mounts it: the kubelet checks nothing, a node whose modules are
    # built in (or kept elsewhere) still starts the pod.
    assert volumes["lib-modules"]["hostPath"] == {"path": "/lib/modules"}
    assert mounts["lib-modules"] == {
        "name": "lib-modules",
        "mountPath": "/lib/modules",
        "readOnly": True,
    }


def test_ebpf_mounts_the_nodes_cgroup2_and_bpffs_and_names_them_in_the_trust_list(
    chart: helm.Chart,
) -> None:
    values = {"mode": "ebpf", "ebpf": {"cgroupRoot": "/sys/fs/cgroup/unified"}}
    objects = render(chart, values)
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    assert volumes["cgroup2"]["hostPath"] == {"path": "/sys/fs/cgroup/unified", "type": "Directory"}
    assert volumes["bpffs"]["hostPath"] == {"path": "/sys/fs/bpf", "type": "Directory"}
    # A bpffs the node mounts after the pod started still reaches it: pins land on the node.
    assert {m["mountPropagation"] for m in (mounts["cgroup2"], mounts["bpffs"])} == {
        "HostToContainer"
    }
    assert mounts["cgroup2"]["readOnly"] is True  # attaching writes nothing there
    assert not mounts["bpffs"].get("readOnly", False)  # the pins are written there

    # The trust list kubeplex reads there (every command: the environment names it) is the
    # packaged one, with the mode's options naming the container's mounts.
    env = {e["name"]: e.get("value") for e in container(objects)["env"]}
    trust_path = Path(env["KUBEPLEX_PLUGINS"])
    assert trust_path.parent == Path(mounts["config"]["mountPath"])
    text = only(objects, "ConfigMap")["data"][trust_path.name]
    written = parse_trust_list(text, "configmap")
    packaged = plugins.load_trust_list()
    assert written.backends.keys() == packaged.backends.keys()
    for mode, entry in packaged.backends.items():
        if mode != "ebpf":
            assert written.backends[mode] == entry, mode
    options = written.backends["ebpf"].options
    assert options == {
        "cgroup": mounts["cgroup2"]["mountPath"],
        "bpffs": mounts["bpffs"]["mountPath"],
    }
    ebpf = written.backends["ebpf"]
    assert (ebpf.entry_point, ebpf.capabilities) == (
        packaged.backends["ebpf"].entry_point,
        packaged.backends["ebpf"].capabilities,
    )


@pytest.mark.parametrize("mode", ["iptables", "nftables", "ipvs"])
def test_other_linux_modes_mount_the_bpffs_to_clean_up_what_ebpf_left(
    chart: helm.Chart, mode: str
) -> None:
    """A switch away from ebpf (helm upgrade --set mode=...) removes its pins, which detaches
    its programs: the other modes need the node's bpffs and the options naming it, not its
    cgroup2 nor CAP_BPF."""
    objects = render(chart, {"mode": mode})
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    assert "cgroup2" not in volumes
    assert volumes["bpffs"]["hostPath"] == {"path": "/sys/fs/bpf"}  # no type: may be absent
    env = {e["name"]: e.get("value") for e in container(objects)["env"]}
    text = only(objects, "ConfigMap")["data"][Path(env["KUBEPLEX_PLUGINS"]).name]
    options = parse_trust_list(text, "configmap").backends["ebpf"].options
    assert options["bpffs"] == mounts["bpffs"]["mountPath"]
    assert "BPF" not in container(objects)["securityContext"]["capabilities"]["add"]


def test_kernelspace_keeps_the_packaged_trust_list(chart: helm.Chart) -> None:
    objects = render(chart, {"mode": "kernelspace"})
    assert set(only(objects, "ConfigMap")["data"]) == {"config.conf"}
    assert "KUBEPLEX_PLUGINS" not in {e["name"] for e in container(objects)["env"]}
    assert not {"cgroup2", "bpffs"} & {v["name"] for v in pod_spec(objects)["volumes"]}


@pytest.mark.parametrize("mode", MODES)
def test_extra_volumes_reach_the_pod(chart: helm.Chart, mode: str) -> None:
    objects = render(chart, {**EVERYTHING, "mode": mode})
    volumes = pod_spec(objects)["volumes"]
    mounts = container(objects)["volumeMounts"]
    assert volumes[0]["name"] == "config" and mounts[0]["name"] == "config"
    assert volumes[-1] == {"name": "certs", "hostPath": {"path": "/etc/pki", "type": "Directory"}}
    assert mounts[-1] == {"name": "certs", "mountPath": "/etc/pki", "readOnly": True}


# --- the API server's address ------------------------------------------------------------------


def master_args(objects: list[dict[str, Any]]) -> list[str]:
    return [a for a in container(objects)["args"] if a.startswith("--master")]


def notes(chart: helm.Chart, values: dict[str, Any]) -> str:
    return next(t for p, t in render_files(chart, values).items() if p.endswith("NOTES.txt"))


def test_by_default_the_proxy_dials_the_in_cluster_service_and_the_notes_say_so(
    chart: helm.Chart,
) -> None:
    assert master_args(render(chart)) == []
    text = notes(chart, {})
    assert "in-cluster `kubernetes` Service" in text
    assert "without kube-proxy" in text
    assert "--set apiServer.host=" in text
    assert "helm uninstall" in text and "kubeplex cleanup" in text


@pytest.mark.parametrize(
    ("api_server", "master"),
    [
        ({"host": "192.168.1.10"}, "https://192.168.1.10:6443"),
        ({"host": "cp.example.com", "port": 443}, "https://cp.example.com:443"),
        ({"host": "fd00::10", "port": 6443}, "https://[fd00::10]:6443"),
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_api_server_host_becomes_master(
    chart: helm.Chart, mode: str, api_server: dict[str, Any], master: str
) -> None:
    values = {"mode": mode, "apiServer": api_server}
    objects = render(chart, values)
    assert master_args(objects) == [f"--master={master}"]
    # The command line the chart builds is one kubeplex accepts, with that address.
    args = cli.parser().parse_args(container(objects)["args"])
    assert args.master == master
    assert f"API server: {master} (apiServer.host)" in notes(chart, values)
    validate(only(objects, "DaemonSet"))


@pytest.mark.parametrize(
    ("mode", "values", "capabilities"),
    [
        ("iptables", {}, ["NET_ADMIN", "NET_RAW"]),
        ("nftables", {}, ["NET_ADMIN"]),
        ("ebpf", {}, ["NET_ADMIN", "BPF"]),
        ("ebpf", {"loadKernelModules": True}, ["NET_ADMIN", "BPF"]),
        ("ipvs", {}, ["NET_ADMIN", "NET_RAW"]),
        ("ipvs", {"loadKernelModules": True}, ["NET_ADMIN", "NET_RAW", "SYS_MODULE"]),
        ("iptables", {"loadKernelModules": True}, ["NET_ADMIN", "NET_RAW"]),
        ("nftables", {"extraCapabilities": ["SYS_RESOURCE"]}, ["NET_ADMIN", "SYS_RESOURCE"]),
    ],
)
def test_capabilities_follow_the_mode(
    chart: helm.Chart, mode: str, values: dict[str, Any], capabilities: list[str]
) -> None:
    objects = render(chart, {"mode": mode, "securityContext": values})
    context = container(objects)["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": capabilities}


def test_privileged_switch(chart: helm.Chart) -> None:
    objects = render(chart, {"securityContext": {"privileged": True}})
    assert container(objects)["securityContext"] == {"privileged": True}


def init_container(chart: helm.Chart, values: dict[str, Any]) -> dict[str, Any] | None:
    objects = render(chart, values)
    spec = pod_spec(objects)
    if "initContainers" not in spec:
        return None
    (init,) = spec["initContainers"]
    assert init["name"] == "sysctls"
    assert init["image"] == container(objects)["image"]
    # The image's kubeplex entry, as the proxy runs it: no inline program.
    assert init["command"] == container(objects)["command"]
    assert init["securityContext"] == {"privileged": True}
    config_mount = {"name": "config", "mountPath": str(Path(CONFIG_PATH).parent), "readOnly": True}
    # In ipvs mode it loads ip_vs first (the net.ipv4.vs keys appear with it), from the node's
    # modules.
    modules = [{"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": True}]
    ipvs = values.get("mode") == "ipvs"
    assert init["volumeMounts"] == [config_mount, *(modules if ipvs else [])]
    return dict(init)


def set_arguments(init: dict[str, Any]) -> list[str]:
    """The "NAME=VALUE" of each ``--set`` the init container passes to ``kubeplex sysctls``."""
    args: list[str] = [a for a in init["args"] if not a.startswith("--load-module=")]
    assert args[:2] == ["sysctls", f"--config={CONFIG_PATH}"]
    assert all(arg.startswith("--set=") for arg in args[2:]), args
    return [arg.removeprefix("--set=") for arg in args[2:]]


def run_init_container(
    chart: helm.Chart,
    values: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[list[str], Path]:
    """Run the init container's command line through kubeplex's own ``main``, with the
    rendered configuration, against a fake /proc/sys; returns its "key=value" arguments and
    that tree."""
    init = init_container(chart, values)
    assert init is not None
    settings = set_arguments(init)
    config_file = tmp_path / "config.conf"
    config_file.write_text(config_text(render(chart, values)))
    cfg = parse_config(config_file.read_text(), "configmap", known_modes=KNOWN_MODES)
    proc_sys = tmp_path / "proc-sys"
    keys = [s.key for s in sysctls.conntrack_settings(cfg.conntrack)]
    keys += [arg.partition("=")[0].replace(".", "/") for arg in settings]
    for key in keys:
        (proc_sys / key).parent.mkdir(parents=True, exist_ok=True)
        (proc_sys / key).write_text("0\n")
    write = sysctls.write_sysctls

    def fake_write(
        settings: list[sysctls.SysctlSetting], *, netns: str | None = None
    ) -> sysctls.SysctlReport:
        assert netns is None
        return write(settings, proc_sys=proc_sys, hashsize=None)

    monkeypatch.setattr(sysctls, "write_sysctls", fake_write)
    # The ConfigMap is mounted at CONFIG_PATH in the container; here it is config_file.
    args = [
        f"--config={config_file}" if a == f"--config={CONFIG_PATH}" else a for a in init["args"]
    ]
    capsys.readouterr()
    assert cli.main(args) == cli.EXIT_OK
    # Every key differed (all were 0), so each is reported once, in order.
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"set {key.replace('/', '.')} = {read_sysctl(proc_sys, key)} (was 0)" for key in keys
    ]
    # The proxy, computing the same conntrack settings, finds nothing left to write.
    again = write(sysctls.conntrack_settings(cfg.conntrack), proc_sys=proc_sys, hashsize=None)
    assert again.changed == [] and again.errors == []
    return settings, proc_sys


def read_sysctl(proc_sys: Path, name: str) -> int:
    """The value of a dotted name (or of a key with slashes) in the fake /proc/sys."""
    return int((proc_sys / name.replace(".", "/")).read_text())


def test_sysctl_init_container_sets_what_the_proxy_would(
    chart: helm.Chart,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, proc_sys = run_init_container(chart, {}, tmp_path, monkeypatch, capsys)
    assert settings == ["net.ipv4.conf.all.route_localnet=1"]
    cpus = sysctls.detect_cpus()
    assert read_sysctl(proc_sys, "net.netfilter.nf_conntrack_max") == max(32768 * cpus, 131072)
    assert read_sysctl(proc_sys, "net.netfilter.nf_conntrack_tcp_timeout_established") == 86400
    assert read_sysctl(proc_sys, "net.netfilter.nf_conntrack_tcp_timeout_close_wait") == 3600
    assert read_sysctl(proc_sys, "net.ipv4.conf.all.route_localnet") == 1


def test_sysctl_init_container_follows_the_values(
    chart: helm.Chart,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    values = {
        "mode": "nftables",
        "config": {"conntrack": {"maxPerCore": 0, "tcpBeLiberal": True, "udpTimeout": "1m"}},
        "sysctlInit": {"extraSysctls": {"net.ipv4.ip_forward": 1}},
    }
    settings, proc_sys = run_init_container(chart, values, tmp_path, monkeypatch, capsys)
    assert settings == ["net.ipv4.ip_forward=1"]  # no route_localnet outside iptables mode
    assert not (proc_sys / "net/netfilter/nf_conntrack_max").exists()  # maxPerCore 0: untouched
    assert read_sysctl(proc_sys, "net.netfilter.nf_conntrack_tcp_be_liberal") == 1
    assert read_sysctl(proc_sys, "net.netfilter.nf_conntrack_udp_timeout") == 60
    assert read_sysctl(proc_sys, "net.ipv4.ip_forward") == 1


def test_sysctl_init_container_sets_what_the_ipvs_proxier_would(
    chart: helm.Chart,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    loaded: list[list[str]] = []
    monkeypatch.setattr(sysctls_command, "load_modules", loaded.append)
    values = {"mode": "ipvs", "config": {"ipvs": {"strictARP": True, "scheduler": "wrr"}}}
    settings, proc_sys = run_init_container(chart, values, tmp_path, monkeypatch, capsys)
    assert loaded == [["ip_vs", "ip_vs_wrr"]]
    assert settings == [
        "net.ipv4.conf.all.arp_announce=2",
        "net.ipv4.conf.all.arp_ignore=1",
        "net.ipv4.ip_forward=1",
        "net.ipv4.vs.conntrack=1",
        "net.ipv4.vs.expire_nodest_conn=1",
        "net.ipv4.vs.expire_quiescent_template=1",
    ]
    assert read_sysctl(proc_sys, "net.ipv4.vs.conntrack") == 1
    # Without strictARP the ARP settings stay the node's.
    init = init_container(chart, {"mode": "ipvs"})
    assert init is not None
    assert not any("arp_" in s for s in set_arguments(init))
    assert "--load-module=ip_vs_rr" in init["args"]  # the default scheduler's module


def test_sysctl_init_container_is_only_there_when_needed(chart: helm.Chart) -> None:
    def settings(values: dict[str, Any]) -> list[str] | None:
        init = init_container(chart, values)
        return None if init is None else set_arguments(init)

    assert settings({"config": {"iptables": {"localhostNodePorts": False}}}) == []
    assert settings({"sysctlInit": {"enabled": False}}) is None
    assert settings({"securityContext": {"privileged": True}}) is None  # the proxy does it
    assert settings({"mode": "kernelspace"}) is None


def test_sysctl_init_container_runs_the_configured_command(chart: helm.Chart) -> None:
    command = ["python3", "-m", "kubeplex.core.cli.main"]
    init = init_container(chart, {**EVERYTHING, "command": command})
    assert init is not None
    assert init["command"] == command
    assert set_arguments(init) == ["net.ipv4.conf.all.route_localnet=1", "net.ipv4.ip_forward=1"]
    # The proxy's extraArgs and verbosity are not passed on: `run` flags, not `sysctls` ones.
    args = cli.parser().parse_args(init["args"])
    assert (args.command, args.config, args.netns) == ("sysctls", Path(CONFIG_PATH), None)
    assert args.sysctls == [("net/ipv4/conf/all/route_localnet", 1), ("net/ipv4/ip_forward", 1)]


def test_kernelspace_is_a_windows_host_process(chart: helm.Chart) -> None:
    objects = render(chart, {"mode": "kernelspace"})
    spec = pod_spec(objects)
    assert spec["securityContext"] == {
        "windowsOptions": {"hostProcess": True, "runAsUserName": "NT AUTHORITY\\system"}
    }
    proxy = container(objects)
    assert "securityContext" not in proxy  # Linux capabilities are refused for Windows pods
    assert "initContainers" not in spec
    assert [v["name"] for v in spec["volumes"]] == ["config"]
    assert [m["name"] for m in proxy["volumeMounts"]] == ["config"]


def test_values_reach_the_daemonset(chart: helm.Chart) -> None:
    objects = render(
        chart,
        {
            **EVERYTHING,
            "image": {
                "repository": "registry.example/kubeplex",
                "tag": "dev",
                "pullPolicy": "Always",
            },
            "logVerbosity": 4,
            "priorityClassName": "custom",
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        },
    )
    daemonset = only(objects, "DaemonSet")
    spec = pod_spec(objects)
    proxy = container(objects)
    assert proxy["image"] == "registry.example/kubeplex:dev"
    assert proxy["imagePullPolicy"] == "Always"
    assert proxy["args"][3:] == ["--v=4", "--cluster-cidr=10.244.0.0/16"]
    assert {"name": "TZ", "value": "UTC"} in proxy["env"]
    # Helm merges maps into the defaults: the default memory request stays.
    assert proxy["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert spec["priorityClassName"] == "custom"
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert spec["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "node-role.kubernetes.io/worker": "",
    }
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    template = daemonset["spec"]["template"]["metadata"]
    assert template["labels"]["tier"] == "node"
    assert template["annotations"]["example.com/owner"] == "net"
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "10%"}


def test_metrics_service_and_service_monitor(chart: helm.Chart) -> None:
    objects = render(chart, EVERYTHING)
    service = only(objects, "Service")
    monitor = only(objects, "ServiceMonitor")
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 10249, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    # The ServiceMonitor (a CRD, so no Kubernetes schema) selects that Service and its port.
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == (
        "metrics",
        "/metrics",
        "30s",
    )
    cfg = parse_config(config_text(objects), "configmap", known_modes=KNOWN_MODES)
    assert cfg.metrics_bind_address == "0.0.0.0:10249"


# --- documentation ---------------------------------------------------------------------------


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if (
            isinstance(value, dict)
            and value
            and key not in ("resources", "livenessProbe", "readinessProbe")
        ):
            yield from _leaf_keys(value, path)
        else:
            yield path


def test_readme_values_table_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    missing = [key for key in _leaf_keys(values) if key not in documented]
    assert missing == []
    assert "--set mode=nftables" in readme


def test_readme_install_commands_render(chart: helm.Chart) -> None:
    readme = (CHART / "README.md").read_text()
    commands = re.findall(r"^helm install .*$", readme, flags=re.MULTILINE)
    assert len(commands) >= 3
    for command in commands:
        values: dict[str, Any] = {}
        for expression in re.findall(r"--set (\S+)", command):
            values.update(helm.parse_set_string(expression))
        mode = values["mode"]
        objects = render(chart, values)
        cfg = parse_config(config_text(objects), "configmap", known_modes=KNOWN_MODES)
        assert cfg.mode == mode
