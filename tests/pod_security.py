"""The Kubernetes Pod Security Standards' "restricted" profile (baseline included), checked on pod specs
as the API server's PodSecurity admission would (kubernetes.io/docs/concepts/security/pod-security-standards,
the rules of policy version v1.30 and later). Used by tests/test_k8s.py on every rendered overlay,
KubeRay's pod templates and its autoscaler sidecar included."""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in ("containers", "initContainers", "ephemeralContainers") for c in spec.get(key) or []]


def violations(spec: dict[str, Any], where: str) -> list[str]:
    """What in a pod spec the restricted profile forbids, one line each (empty: admitted)."""
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            out.append(f"{where}: {flag}")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"{where}: hostProcess")
    for volume in spec.get("volumes") or []:
        kind = next((k for k in volume if k != "name"), "")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"{where}: volume {volume['name']} of type {kind}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"{where}: sysctl {sysctl.get('name')}")
    out += _selinux_and_seccomp(pod_sc, f"{where} pod")
    if pod_sc.get("runAsUser") == 0:
        out.append(f"{where}: pod runAsUser 0")
    for c in containers(spec):
        out += container_violations(c, pod_sc, f"{where} container {c.get('name')}")
    return out


def container_violations(c: dict[str, Any], pod_sc: dict[str, Any], where: str) -> list[str]:
    sc = c.get("securityContext") or {}
    out = _selinux_and_seccomp(sc, where)
    if sc.get("privileged"):
        out.append(f"{where}: privileged")
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"{where}: hostProcess")
    if sc.get("procMount", "Default") != "Default":
        out.append(f"{where}: procMount {sc['procMount']}")
    if any(p.get("hostPort") for p in c.get("ports") or []):
        out.append(f"{where}: hostPort")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation is not false")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"{where}: capabilities do not drop ALL")
    added = set(caps.get("add") or [])
    if added - {"NET_BIND_SERVICE"}:
        out.append(f"{where}: adds capabilities {sorted(added - {'NET_BIND_SERVICE'})}")
    if added - BASELINE_CAPABILITIES:
        out.append(f"{where}: adds capabilities outside the baseline")
    non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    if non_root is not True:
        out.append(f"{where}: runAsNonRoot is not true (container or pod)")
    if sc.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser 0")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"{where}: seccompProfile is not RuntimeDefault or Localhost (container or pod)")
    return out


def _selinux_and_seccomp(sc: dict[str, Any], where: str) -> list[str]:
    out = []
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        out.append(f"{where}: seLinuxOptions {selinux}")
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append(f"{where}: seccompProfile Unconfined")
    if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"{where}: appArmorProfile {sc['appArmorProfile']}")
    return out


def pod_specs(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) for every pod a rendered object makes: workloads' templates, a RayService's
    head and worker groups, and the autoscaler sidecar KubeRay adds to the head (its securityContext
    comes from autoscalerOptions, the rest of its pod is the head's)."""
    kind, name = doc["kind"], doc["metadata"]["name"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return [(f"{kind}/{name}", doc["spec"]["template"]["spec"])]
    if kind == "Pod":
        return [(f"Pod/{name}", doc["spec"])]
    if kind != "RayService":
        return []
    cluster = doc["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    out = [(f"RayService/{name} head", head)]
    out += [(f"RayService/{name} {g['groupName']}", g["template"]["spec"]) for g in cluster.get("workerGroupSpecs", [])]
    if cluster.get("enableInTreeAutoscaling"):
        options = cluster.get("autoscalerOptions") or {}
        sidecar = {"name": "autoscaler", "securityContext": options.get("securityContext")}
        out.append((f"RayService/{name} autoscaler sidecar", {**head, "containers": [sidecar]}))
    return out
