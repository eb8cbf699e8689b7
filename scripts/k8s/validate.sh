#!/usr/bin/env bash
# Checks the Kubernetes manifests and the agent-sandbox resources offline (scripts/k8s/validate.py
# says what): installs kubectl (its kustomize renders) when missing, and the pinned validators
# into target/k8s-venv. Called by scripts/test.sh; runs alone in about 20 s.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v kubectl >/dev/null; then
  echo "validate.sh: installing kubectl"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubectl >/dev/null \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null \
    || true
fi
if ! command -v kubectl >/dev/null; then
  echo "SKIP scripts/k8s/validate.sh: kubectl is not installable here (no apt package); the manifests were not checked"
  exit 0
fi
if ! target/k8s-venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit((m.version("kubernetes-validate"), m.version("jsonschema"), m.version("PyYAML")) != ("1.37.0", "4.26.0", "6.0.4"))' 2>/dev/null; then
  echo "installing kubernetes-validate 1.37.0, jsonschema 4.26.0 and PyYAML 6.0.4 into target/k8s-venv"
  rm -rf target/k8s-venv
  /usr/bin/python3 -m venv target/k8s-venv
  target/k8s-venv/bin/pip install -q --disable-pip-version-check kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.4
fi
# The ConfigMap's runcell.toml is also started with runcell itself, when a build is there
# (scripts/test.sh builds target/debug/runcell first).
runcell=()
[ -x target/debug/runcell ] && runcell=(--runcell target/debug/runcell)
exec target/k8s-venv/bin/python scripts/k8s/validate.py --kubectl "$(command -v kubectl)" "${runcell[@]}"
