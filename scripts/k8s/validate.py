#!/usr/bin/env python3
"""Checks the Kubernetes manifests (deploy/k8s) and the agent-sandbox resources
(deploy/agent-sandbox), offline:

  render    `kubectl kustomize` of the base and of every overlay.
  shape     the base holds one StatefulSet, a ClusterIP and a headless Service, a PDB, ...
  schema    `kubernetes-validate --strict` for the newest Kubernetes its package ships; kinds
            it has no schema for are checked against their CRD where one is vendored
            (deploy/k8s/crds, deploy/agent-sandbox/crds), with unknown fields as errors (the
            API server prunes or rejects them), or skipped by name with a note.
  policy    every runcell container has the security context of its shape (docs/kubernetes.md:
            P1 in the base and agent-sandbox, P2/P3 in the privileged and kata overlays), memory
            requests = limits, and a memory limit no lower than the sizing formula
            (scripts/k8s/sizing.py) computed from the pod's runcell settings.
  seccomp   deploy/k8s/seccomp/runcell.json allows what nested sandboxes need, and the
            Security Profiles Operator resource generated from it is up to date.
  negative  fixtures (scripts/k8s/fixtures) that break one rule each must fail, each for its
            own reason, so that none of the checks above can pass vacuously.

Usage: validate.py [--kubectl PATH] [--runcell BINARY]   (scripts/k8s/validate.sh installs what it needs)
Prints one line per check and a closing "N passed, N failed" line; exits 1 on any failure.
"""

import argparse
import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import jsonschema
import kubernetes_validate
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seccomp_spo  # noqa: E402
import sizing  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
AGENT_SANDBOX = os.path.join(ROOT, "deploy", "agent-sandbox")
FIXTURES = os.path.join(ROOT, "scripts", "k8s", "fixtures")
SECCOMP_JSON = os.path.join(K8S, "seccomp", "runcell.json")
METRICS_RS = os.path.join(ROOT, "crates", "runcell-server", "src", "metrics.rs")
CRD_DIRS = [os.path.join(K8S, "crds"), os.path.join(AGENT_SANDBOX, "crds")]

# The syscalls nested sandboxes need beyond RuntimeDefault, as a non-root user in a user
# namespace (docs/kubernetes.md, "Shapes").
NESTED_SYSCALLS = ["clone", "unshare", "mount", "umount2", "pivot_root", "open_tree", "move_mount",
                   "mount_setattr", "sethostname"]
# The series the saturation metric is made of (crates/runcell-server/src/metrics.rs).
SATURATION_METRICS = ["sandboxes_running", "queue_depth", "max_concurrent"]


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def ok(self, what):
        self.passed += 1
        print(f"ok    {what}")

    def fail(self, what, errors):
        self.failed += 1
        print(f"FAIL  {what}")
        for e in errors:
            print(f"        {e}")

    def check(self, what, errors):
        if errors:
            self.fail(what, errors)
        else:
            self.ok(what)

    def skip(self, what, why):
        self.skipped += 1
        print(f"SKIP  {what}: {why}")


# ---------------------------------------------------------------------------------------------
# Rendering


def render(kubectl, directory):
    r = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip() or f"kubectl kustomize {directory} failed")
    return r.stdout


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


# ---------------------------------------------------------------------------------------------
# Schemas


def strict_schema(schema):
    """A CRD's openAPIV3Schema as a JSON schema in which unknown fields are errors.

    Structural schemas prune unknown fields (or reject them with fieldValidation=Strict, the
    kubectl default): an object with `properties` and no `additionalProperties` allows no
    others, unless it says x-kubernetes-preserve-unknown-fields. `nullable` allows null.
    """
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("nullable") and "type" in node:
                node["type"] = [node["type"], "null"]
            if (node.get("type") == "object" or "properties" in node) and "properties" in node \
                    and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    # metadata is `type: object` in a CRD; the API server checks it as ObjectMeta.
    s.setdefault("properties", {})["metadata"] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    return s


def load_crds():
    """(group/version, kind) -> strict JSON schema, from the vendored CRDs."""
    crds = {}
    for d in CRD_DIRS:
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if not f.endswith(".yaml"):
                continue
            with open(os.path.join(d, f)) as fh:
                crd = yaml.safe_load(fh)
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for v in crd["spec"]["versions"]:
                if v.get("served"):
                    crds[(f"{group}/{v['name']}", kind)] = strict_schema(v["schema"]["openAPIV3Schema"])
    return crds


def crd_errors(doc, crds):
    """Errors of `doc` against its vendored CRD; None when no CRD is vendored for it."""
    schema = crds.get((doc.get("apiVersion"), doc.get("kind")))
    if schema is None:
        return None
    v = jsonschema.Draft4Validator(schema)
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def schema_errors(text, docs, crds, version, report, label):
    """kubernetes-validate --strict over the rendered text, then CRD kinds. Returns errors."""
    errors = []
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "kubernetes-validate"),
                            "--strict", "--no-warn", "--quiet", "-k", version, path],
                           capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        errors += [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    for d in docs:
        try:
            kubernetes_validate.validate(d, version, strict=True)
            continue
        except kubernetes_validate.SchemaNotFoundError:
            pass
        except kubernetes_validate.ValidationError:
            continue  # reported by the command above
        found = crd_errors(d, crds)
        name = f"{d['kind']}/{d['metadata']['name']}"
        if found is None:
            report.skip(f"schema of {label}: {name}", f"no schema for {d['apiVersion']} {d['kind']} "
                        "(not in kubernetes-validate, no CRD vendored)")
        else:
            errors += [f"{name}: {e}" for e in found]
    return errors


# ---------------------------------------------------------------------------------------------
# Policy


def pod_specs(docs):
    """(owner name, pod spec) of every workload and agent-sandbox template."""
    out = []
    for d in docs:
        spec = d.get("spec") or {}
        if d.get("kind") in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
            out.append((f"{d['kind']}/{d['metadata']['name']}", spec["template"]["spec"]))
        elif d.get("kind") == "SandboxTemplate":
            out.append((f"{d['kind']}/{d['metadata']['name']}", spec["podTemplate"]["spec"]))
    return out


def runcell_containers(pod):
    return [c for c in pod.get("containers", []) + pod.get("initContainers", [])
            if "runcell" in c.get("image", "") or c.get("name") == "runcell"]


def env_value(container, name):
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value"), e.get("valueFrom")
    return None, None


def pairs(text):
    out = {}
    for item in text.split(","):
        if item.strip():
            k, _, v = item.partition("=")
            out[k.strip()] = v.strip()
    return out


def settings_of(pod, container, configmaps):
    """The runcell settings a container starts with: its --config file (from a ConfigMap
    volume), then the RUNCELL_* environment over it (as runcell merges them)."""
    settings = {}
    args = container.get("args", []) + container.get("command", [])
    config = None
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            config = args[i + 1]
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
    value, _ = env_value(container, "RUNCELL_CONFIG")
    config = config or value
    if config:
        directory, filename = os.path.split(config)
        mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == directory), None)
        volume = mount and next((v for v in pod.get("volumes", []) if v["name"] == mount["name"]), None)
        if not volume or "configMap" not in volume:
            raise sizing.SizingError(f"{config} is not from a ConfigMap volume")
        cm = configmaps.get(volume["configMap"]["name"])
        if cm is None or filename not in cm.get("data", {}):
            raise sizing.SizingError(f"ConfigMap {volume['configMap']['name']} has no {filename}")
        settings = tomllib.loads(cm["data"][filename])
    for name, key, kind in [("RUNCELL_MAX_CONCURRENT", "max_concurrent", int), ("RUNCELL_MAX_QUEUE", "max_queue", int),
                            ("RUNCELL_MAX_BODY", "max_body", str)]:
        value, _ = env_value(container, name)
        if value is not None:
            settings[key] = kind(value)
    value, _ = env_value(container, "RUNCELL_MAX_LIMITS")
    if value is not None:
        settings.setdefault("limits", {}).setdefault("max", {}).update(pairs(value))
    value, _ = env_value(container, "RUNCELL_MAX_SESSIONS")
    if value is not None:
        settings.setdefault("sessions", {})["max"] = int(value)
    value, _ = env_value(container, "RUNCELL_POOL")
    if value is not None:
        settings.setdefault("pool", {}).update({k: int(v) for k, v in pairs(value).items()})
    value, _ = env_value(container, "RUNCELL_PRELOAD")
    if value is not None:
        lang, _, mods = value.partition("=")
        settings.setdefault("preload", {})[lang] = [m for m in mods.split(",") if m]
    return settings


def cpu_cores(quantity):
    q = str(quantity)
    return math.ceil(int(q[:-1]) / 1000) if q.endswith("m") else math.ceil(float(q))


def memory_errors(pod, c, configmaps):
    errors = []
    res = c.get("resources", {})
    req, lim = res.get("requests", {}).get("memory"), res.get("limits", {}).get("memory")
    if lim is None:
        return ["no memory limit"]
    if req is None or sizing.parse_quantity(req) != sizing.parse_quantity(lim):
        errors.append(f"memory requests ({req}) != limits ({lim}): memory must not be overcommitted")
    cpu = res.get("limits", {}).get("cpu") or res.get("requests", {}).get("cpu") or "1"
    try:
        need, terms = sizing.required_memory(settings_of(pod, c, configmaps), cpu_cores(cpu))
    except sizing.SizingError as e:
        return errors + [f"sizing: {e}"]
    have = sizing.parse_quantity(lim)
    if have < need:
        errors.append(f"memory limit {lim} ({have / sizing.MIB:.0f} MiB) is below what runcell admits: "
                      f"{sizing.describe(terms)}")
    return errors


def p1_errors(pod, c):
    """The unprivileged, user-namespaced shape (P1)."""
    errors = []
    psc, sc = pod.get("securityContext", {}), c.get("securityContext", {})

    def eff(key):
        return sc.get(key, psc.get(key))

    if pod.get("hostUsers") is not False:
        errors.append("hostUsers must be false (a user namespace per pod)")
    if eff("runAsNonRoot") is not True:
        errors.append("runAsNonRoot must be true")
    if eff("runAsUser") in (None, 0):
        errors.append("runAsUser must be a non-zero uid")
    if sc.get("procMount") != "Unmasked":
        errors.append("procMount must be Unmasked (the sandboxes mount their own proc)")
    profile = sc.get("seccompProfile") or psc.get("seccompProfile") or {}
    if not (profile.get("type") == "Localhost" and str(profile.get("localhostProfile", "")).endswith("runcell.json")):
        errors.append(f"seccompProfile must be Localhost runcell.json, not {profile or 'unset'}")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"] or caps.get("add"):
        errors.append(f"capabilities must be drop: [ALL] with nothing added, not {caps or 'unset'}")
    if sc.get("allowPrivilegeEscalation") is not False:
        errors.append("allowPrivilegeEscalation must be false")
    if sc.get("privileged"):
        errors.append("privileged must not be set")
    if sc.get("readOnlyRootFilesystem") is not True:
        errors.append("readOnlyRootFilesystem must be true")
    return errors


def full_enforcement_errors(pod, c):
    """Root in a privileged container, strict (P2, P3)."""
    errors = []
    sc = c.get("securityContext", {})
    if sc.get("privileged") is not True:
        errors.append("privileged must be true")
    if sc.get("runAsUser", pod.get("securityContext", {}).get("runAsUser")) != 0:
        errors.append("runAsUser must be 0 (runcell's root path)")
    if pod.get("hostUsers") is False or sc.get("procMount") == "Unmasked":
        errors.append("no user namespace (hostUsers) nor Unmasked procMount with privileged root")
    if sc.get("readOnlyRootFilesystem") is not True:
        errors.append("readOnlyRootFilesystem must be true")
    if env_value(c, "RUNCELL_STRICT")[0] not in ("1", "true"):
        errors.append("RUNCELL_STRICT must be on: full enforcement or nothing")
    return errors


def server_errors(pod, c, configmaps):
    """What every runcell pool server needs whatever its shape."""
    errors = []
    if pod.get("automountServiceAccountToken") is not False:
        errors.append("automountServiceAccountToken must be false")
    _, src = env_value(c, "RUNCELL_POD_NAME")
    if not src or src.get("fieldRef", {}).get("fieldPath") != "metadata.name":
        errors.append("RUNCELL_POD_NAME must come from the downward API (metadata.name)")
    for key in ("RUNCELL_CLUSTER_KEY", "RUNCELL_API_KEY"):
        _, src = env_value(c, key)
        if not src or "secretKeyRef" not in src:
            errors.append(f"{key} must come from a Secret")
    value, _ = env_value(c, "RUNCELL_CLUSTER_PEER_URL")
    if not value or "{pod}" not in value:
        errors.append("RUNCELL_CLUSTER_PEER_URL must name the peer by {pod}")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        errors.append("readiness must probe /readyz")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        errors.append("liveness must probe /healthz")
    try:
        grace = settings_of(pod, c, configmaps).get("shutdown_grace", "30s")
    except sizing.SizingError as e:
        return errors + [str(e)]
    grace_s = float(str(grace).rstrip("s")) if not str(grace).endswith("m") else float(str(grace)[:-1]) * 60
    pause = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    if pause <= 0:
        errors.append("preStop must pause until the pod is out of the Service's endpoints")
    if pod.get("terminationGracePeriodSeconds", 30) < grace_s + pause:
        errors.append(f"terminationGracePeriodSeconds must cover preStop ({pause} s) + shutdown_grace ({grace})")
    return errors


def policy_errors(docs, shape):
    """shape: p1 (base), privileged, kata, agent-sandbox."""
    errors = []
    configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    specs = pod_specs(docs)
    if not specs:
        return ["no runcell workload"]
    for owner, pod in specs:
        containers = runcell_containers(pod)
        if not containers:
            errors.append(f"{owner}: no runcell container")
        for c in containers:
            where = f"{owner} container {c['name']}"
            found = []
            if shape in ("p1", "agent-sandbox"):
                found += p1_errors(pod, c)
                if pod.get("automountServiceAccountToken") is not False:
                    found.append("automountServiceAccountToken must be false")
            else:
                found += full_enforcement_errors(pod, c)
            if shape == "kata" and pod.get("runtimeClassName") != "kata":
                found.append("runtimeClassName must be kata")
            if shape == "privileged":
                tol = [t.get("key") for t in pod.get("tolerations", [])]
                if "runcell.dev/dedicated" not in tol or "runcell.dev/dedicated" not in pod.get("nodeSelector", {}):
                    found.append("privileged pods must be pinned to dedicated nodes (nodeSelector + toleration)")
            if shape == "agent-sandbox":
                ports = [p.get("containerPort") for p in c.get("ports", [])]
                if 8888 not in ports:
                    found.append("must expose port 8888 (agent-sandbox's runtime contract)")
                probe = c.get("readinessProbe", {}).get("httpGet", {})
                if probe.get("path") != "/" or probe.get("port") != 8888:
                    found.append("readiness must be GET / on 8888")
                args = c.get("args", [])
                if "--agent-sandbox-listen" not in args or args[args.index("--agent-sandbox-listen") + 1] != "0.0.0.0:8888":
                    found.append("must run --agent-sandbox-listen 0.0.0.0:8888")
            else:
                found += server_errors(pod, c, configmaps)
            found += memory_errors(pod, c, configmaps)
            errors += [f"{where}: {e}" for e in found]
    return errors


def shape_errors(docs):
    """The base's objects: what the routing and draining rely on."""
    errors = []
    counts = {k: len(by_kind(docs, k)) for k in ("StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy",
                                                  "ConfigMap", "Secret", "ServiceAccount")}
    want = {"StatefulSet": 1, "Service": 2, "PodDisruptionBudget": 1, "NetworkPolicy": 1, "ConfigMap": 1,
            "Secret": 1, "ServiceAccount": 1}
    if counts != want:
        errors.append(f"objects {counts}, want {want}")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    for sts in by_kind(docs, "StatefulSet"):
        headless = services.get(sts["spec"].get("serviceName"))
        if not headless or headless["spec"].get("clusterIP") != "None":
            errors.append("the StatefulSet's serviceName must be a headless Service")
        elif not headless["spec"].get("publishNotReadyAddresses"):
            errors.append("the headless Service must publish not-ready pods (draining owners serve their sessions)")
        if sts["spec"].get("podManagementPolicy") != "Parallel":
            errors.append("podManagementPolicy must be Parallel")
        if sts["spec"]["template"]["spec"].get("serviceAccountName") not in \
                [a["metadata"]["name"] for a in by_kind(docs, "ServiceAccount")]:
            errors.append("the pods must use the runcell ServiceAccount")
    if [s for s in services.values() if s["spec"].get("clusterIP") != "None" and s["spec"].get("type", "ClusterIP") != "ClusterIP"]:
        errors.append("the client Service must be ClusterIP")
    for a in by_kind(docs, "ServiceAccount"):
        if a.get("automountServiceAccountToken") is not False:
            errors.append("the ServiceAccount must not mount a token")
    for np in by_kind(docs, "NetworkPolicy"):
        if sorted(np["spec"].get("policyTypes", [])) != ["Egress", "Ingress"]:
            errors.append("the NetworkPolicy must restrict ingress and egress")
        ports = {p.get("port") for rule in np["spec"].get("egress", []) for p in rule.get("ports", [])}
        if not ports <= {53, 8080}:
            errors.append(f"egress beyond DNS and the peers by default: ports {sorted(ports)}")
    return errors


def autoscaling_errors(docs, settings_ttl_s):
    errors = []
    with open(METRICS_RS) as f:
        metrics = f.read()
    for name in SATURATION_METRICS:
        if f'"{name}"' not in metrics:
            errors.append(f"runcell exports no {name} (crates/runcell-server/src/metrics.rs)")
    for so in by_kind(docs, "ScaledObject"):
        query = " ".join(t["metadata"].get("query", "") for t in so["spec"]["triggers"])
        for name in SATURATION_METRICS:
            if f"runcell_{name}" not in query:
                errors.append(f"ScaledObject query does not use runcell_{name}")
        window = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        if window < settings_ttl_s:
            errors.append(f"scale-down stabilization {window} s is shorter than the session TTL {settings_ttl_s} s")
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        window = hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        if window < settings_ttl_s:
            errors.append(f"HPA scale-down stabilization {window} s is shorter than the session TTL {settings_ttl_s} s")
    for sm in by_kind(docs, "ServiceMonitor"):
        for ep in sm["spec"]["endpoints"]:
            if not (ep.get("authorization", {}).get("credentials") or ep.get("bearerTokenSecret")):
                errors.append("the ServiceMonitor must send a key (/metrics needs one)")
    if not by_kind(docs, "ServiceMonitor"):
        errors.append("no ServiceMonitor")
    return errors


# ---------------------------------------------------------------------------------------------
# Seccomp


def seccomp_errors(profile):
    """The nested-sandbox syscalls are allowed unconditionally (no capability needed)."""
    allowed = set()
    for r in profile.get("syscalls", []):
        if r.get("action") == "SCMP_ACT_ALLOW" and not r.get("includes", {}).get("caps") and not r.get("args"):
            allowed.update(r.get("names", []))
    missing = [s for s in NESTED_SYSCALLS if s not in allowed]
    errors = [f"runcell.json does not allow {', '.join(missing)} without a capability"] if missing else []
    if profile.get("defaultAction") == "SCMP_ACT_ALLOW":
        errors.append("runcell.json allows every syscall by default")
    return errors


def seccomp_generator_errors():
    """The SPO conversion on a runtime-style fixture: capability-gated rules go, the rest stay."""
    with open(os.path.join(FIXTURES, "seccomp-runtime-style.json")) as f:
        spo = seccomp_spo.convert(json.load(f))
    names = [n for r in spo["spec"]["syscalls"] for n in r["names"]]
    errors = []
    if "bpf" in names:
        errors.append("a rule that needs CAP_SYS_ADMIN was kept")
    for want in ("read", "pivot_root", "personality"):
        if want not in names:
            errors.append(f"{want} was dropped")
    if spo["spec"].get("architectures") != ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]:
        errors.append(f"architectures {spo['spec'].get('architectures')}")
    return errors


# ---------------------------------------------------------------------------------------------


def docs_sizing_errors(rendered):
    """The base's and the worked example's memory in docs/kubernetes.md, recomputed."""
    with open(os.path.join(ROOT, "docs", "kubernetes.md")) as f:
        text = f.read()
    errors = []
    example = {"max_concurrent": 8, "max_queue": 16, "max_body": "16M", "pool": {"python": 8},
               "preload": {"python": ["numpy", "pandas", "matplotlib.pyplot"]},
               "limits": {"max": {"memory": "512M", "disk": "64M"}}, "sessions": {"max": 32}}
    cases = [("the worked example", example, 8)]
    base = rendered.get("base")
    if base:
        toml_text = by_kind(base, "ConfigMap")[0]["data"]["runcell.toml"]
        cases.append(("the base", tomllib.loads(toml_text), 2))
    for name, settings, cores in cases:
        need, _ = sizing.required_memory(settings, cores)
        figure = f"{math.ceil(need / sizing.MIB):,} MiB"
        if figure not in text:
            errors.append(f"{name}: sizing.py gives {figure}, which docs/kubernetes.md does not say")
    return errors


def session_ttl_seconds(docs):
    for cm in by_kind(docs, "ConfigMap"):
        if "runcell.toml" in cm.get("data", {}):
            ttl = str(tomllib.loads(cm["data"]["runcell.toml"]).get("sessions", {}).get("ttl", "10m"))
            return float(ttl[:-1]) * {"s": 1, "m": 60, "h": 3600}[ttl[-1]] if ttl[-1] in "smh" else float(ttl)
    return 600


def config_accepted_errors(runcell, toml_text):
    """runcell itself starts with the ConfigMap's runcell.toml (unknown keys are errors there).

    The listen address is moved to loopback and the pool emptied so nothing is built; the
    key stands in for the Secret's.
    """
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "runcell.toml")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(toml_text)
        env = {"PATH": "/usr/bin:/bin", "HOME": d, "LANG": "C.UTF-8",
               "RUNCELL_API_KEY": "k8s-validate-0123456789abcdef", "RUNCELL_POOL": "python=0"}
        proc = subprocess.Popen([runcell, "serve", "--config", path, "--listen", "127.0.0.1:0",
                                 "--audit-log", "off"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        lines = []
        try:
            for line in proc.stderr:
                lines.append(line.rstrip())
                if "listening on" in line:
                    return []
            proc.wait()
            return [f"runcell serve refused it (exit {proc.returncode}):"] + lines[-5:]
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubectl", default="kubectl")
    ap.add_argument("--runcell", help="a runcell binary: check that it accepts the ConfigMap's runcell.toml")
    a = ap.parse_args()
    report = Report()
    version = kubernetes_validate.utils.latest_version()
    print(f"validate.py: Kubernetes {version} schemas (kubernetes-validate "
          f"{kubernetes_validate.__version__ if hasattr(kubernetes_validate, '__version__') else ''}), "
          f"{a.kubectl}")
    crds = load_crds()

    # Base and overlays.
    targets = [("base", os.path.join(K8S, "base"), "p1")]
    for o in sorted(os.listdir(os.path.join(K8S, "overlays"))):
        shape = {"privileged": "privileged", "kata": "kata"}.get(o, "p1")
        targets.append((f"overlays/{o}", os.path.join(K8S, "overlays", o), shape))
    have_seccomp = os.path.exists(SECCOMP_JSON)
    # overlays/spo renders from its generated seccompprofile.yaml; whether that still matches
    # runcell.json is checked below, once the JSON is in the tree.
    rendered = {}
    for label, directory, shape in targets:
        try:
            text = render(a.kubectl, directory)
        except RuntimeError as e:
            report.fail(f"render {label}", [str(e)])
            continue
        report.ok(f"render {label}")
        docs = docs_of(text)
        rendered[label] = docs
        report.check(f"schema {label} (--strict, {version})", schema_errors(text, docs, crds, version, report, label))
        report.check(f"policy {label} ({shape})", policy_errors(docs, shape))
        if label == "base":
            report.check("shape base", shape_errors(docs))
            toml_text = by_kind(docs, "ConfigMap")[0]["data"]["runcell.toml"]
            if a.runcell:
                report.check(f"config base: {os.path.relpath(a.runcell, ROOT)} accepts runcell.toml",
                             config_accepted_errors(a.runcell, toml_text))
            else:
                report.skip("config base", "no runcell binary given (--runcell)")
        if label.startswith("overlays/autoscaling"):
            report.check(f"autoscaling {label}", autoscaling_errors(docs, session_ttl_seconds(docs)))

    # agent-sandbox.
    docs = []
    for f in sorted(os.listdir(AGENT_SANDBOX)):
        if f.endswith(".yaml"):
            with open(os.path.join(AGENT_SANDBOX, f)) as fh:
                docs += docs_of(fh.read())
    kinds = sorted(d["kind"] for d in docs)
    if kinds != ["SandboxClaim", "SandboxTemplate", "SandboxWarmPool"]:
        report.fail("agent-sandbox resources", [f"kinds {kinds}"])
    for d in docs:
        found = crd_errors(d, crds)
        report.check(f"schema agent-sandbox {d['kind']}/{d['metadata']['name']} (vendored CRD, strict)",
                     ["no CRD vendored"] if found is None else found)
    report.check("policy agent-sandbox (p1)", policy_errors(docs, "agent-sandbox"))
    refs = {d["kind"]: d for d in docs}
    if refs.get("SandboxWarmPool", {}).get("spec", {}).get("sandboxTemplateRef", {}).get("name") != \
            refs.get("SandboxTemplate", {}).get("metadata", {}).get("name") or \
            refs.get("SandboxClaim", {}).get("spec", {}).get("warmPoolRef", {}).get("name") != \
            refs.get("SandboxWarmPool", {}).get("metadata", {}).get("name"):
        report.fail("agent-sandbox references", ["the claim, pool and template do not name each other"])
    else:
        report.ok("agent-sandbox references")

    # Seccomp.
    report.check("seccomp: SPO conversion of a runtime-style profile", seccomp_generator_errors())
    if have_seccomp:
        with open(SECCOMP_JSON) as f:
            profile = json.load(f)
        report.check("seccomp: runcell.json allows the nested-sandbox syscalls", seccomp_errors(profile))
        spo = seccomp_spo.render(profile)
        path = seccomp_spo.OUT
        current = open(path).read() if os.path.exists(path) else None
        report.check("seccomp: overlays/spo/seccompprofile.yaml is generated from runcell.json",
                     [] if current == spo else ["out of date: run scripts/k8s/seccomp_spo.py --write"])
        errs = crd_errors(yaml.safe_load(spo), crds)
        report.check("seccomp: the SeccompProfile against its vendored CRD", errs or [])
    else:
        report.skip("seccomp: runcell.json", "deploy/k8s/seccomp/runcell.json is not in this tree yet")

    # The figures docs/kubernetes.md works out by hand are the formula's.
    report.check("docs: the sizing figures of docs/kubernetes.md are sizing.py's", docs_sizing_errors(rendered))

    # Negative fixtures: each must fail, for its own reason.
    negatives = [
        ("typo-field", "schema", "procMountt"),
        ("no-procmount", "policy", "procMount must be Unmasked"),
        ("memory-below-formula", "policy", "is below what runcell admits"),
        ("memory-overcommitted", "policy", "memory requests"),
        ("default-seccomp", "policy", "seccompProfile must be Localhost"),
    ]
    for name, stage, needle in negatives:
        directory = os.path.join(FIXTURES, name)
        try:
            text = render(a.kubectl, directory)
        except RuntimeError as e:
            report.fail(f"negative {name}", [f"does not render: {e}"])
            continue
        docs = docs_of(text)
        if stage == "schema":
            found = schema_errors(text, docs, crds, version, Report(), name)
        else:
            found = policy_errors(docs, "p1")
        hit = [e for e in found if needle in e]
        report.check(f"negative {name}: {stage} refuses it",
                     [] if hit else [f"expected an error naming '{needle}', got {found or 'none'}"])
    with open(os.path.join(FIXTURES, "sandboxtemplate-typo.yaml")) as f:
        bad = yaml.safe_load(f)
    found = crd_errors(bad, crds) or []
    report.check("negative sandboxtemplate-typo: its CRD refuses it",
                 [] if any("readinesProbe" in e for e in found) else [f"expected readinesProbe refused, got {found}"])
    with open(os.path.join(FIXTURES, "seccomp-runtime-style.json")) as f:
        found = seccomp_errors(json.load(f))
    report.check("negative seccomp-runtime-style: a profile that gates clone and unshare on CAP_SYS_ADMIN is refused",
                 [] if any("clone" in e for e in found) else [f"expected missing syscalls, got {found}"])

    if a.runcell:
        found = config_accepted_errors(a.runcell, "max_concurent = 4\n")
        report.check("negative config typo: runcell refuses a misspelt setting",
                     [] if found and "unknown setting" in " ".join(found) else [f"expected a refusal, got {found}"])
    print(f"k8s: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
