#!/usr/bin/env bash
# The whole test suite: installs what the tests need when it is missing, then runs
# formatting, lints and every test (unit, privileged-in-child, and integration tests that
# run real sandboxes). Needs root (the tests build real sandboxes and cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."

# The suite times itself: each phase as it ends, and one summary line when the script exits
# (after the tests' own closing lines, pass or fail).
suite_start=$(date +%s.%N)
phase_start=$suite_start
phases=()
phase_done() {
  local now
  now=$(date +%s.%N)
  phases+=("$1 $(awk -v a="$phase_start" -v b="$now" 'BEGIN { printf "%.1fs", b - a }')")
  echo "test.sh: $1 took ${phases[-1]#* }"
  phase_start=$now
}
report_duration() {
  local status=$? now summary="" p
  now=$(date +%s.%N)
  for p in "${phases[@]}"; do summary+="$p, "; done
  echo "test.sh: ${summary}total $(awk -v a="$suite_start" -v b="$now" 'BEGIN { printf "%.1fs", b - a }') (exit $status)"
}
trap report_duration EXIT

need=()
[ -x /usr/bin/ruby ] || need+=(ruby)
[ -x /usr/bin/go ] || need+=(golang-go)
[ -x /usr/bin/python3 ] || need+=(python3)
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
[ -x /usr/bin/node ] || need+=(nodejs)
# Templates embed the runtime Python's shared library (docs/isolation.md, "Templates").
if [ -x /usr/bin/python3 ]; then
  libpython=$(/usr/bin/python3 -I -c 'import os, sysconfig as s; print(os.path.join(s.get_config_var("LIBDIR") or "", s.get_config_var("INSTSONAME") or ""))' 2>/dev/null || true)
  case "$libpython" in
    */libpython3.*.so*) [ -e "$libpython" ] || need+=("$(basename "$libpython" | sed 's/\.so.*//')") ;;
  esac
else
  need+=(libpython3.11)
fi
command -v setpriv >/dev/null || need+=(util-linux)
# The documentation's examples (the docs phase) use curl, jq and openssl.
command -v curl >/dev/null || need+=(curl)
command -v jq >/dev/null || need+=(jq)
command -v openssl >/dev/null || need+=(openssl)
command -v ip >/dev/null || need+=(iproute2)
command -v promtool >/dev/null || need+=(prometheus)
# The console's browser test (crates/runcell/tests/console.rs) drives headless chromium.
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Installed above: the browser test must run, not skip.
export RUNCELL_REQUIRE_BROWSER=1
phase_done install

cargo fmt --all -- --check
phase_done fmt
cargo clippy --workspace --all-targets -- -D warnings
phase_done clippy
# The data-stack tests run against the prepared runtimes: install them (idempotent; the Python
# stack comes from PyPI, the Go cache is built locally).
cargo build -q -p runcell
./target/debug/runcell setup
# The MCP tests drive runcell with the official Python MCP client, pinned, in a venv under
# target/ (kept while it has the pinned version; crates/runcell/tests/mcp.rs looks for it).
if ! target/mcp-venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("mcp") != "2.3.0")' 2>/dev/null; then
  echo "installing the Python MCP client (mcp 2.3.0) into target/mcp-venv"
  rm -rf target/mcp-venv
  /usr/bin/python3 -m venv target/mcp-venv
  target/mcp-venv/bin/pip install -q --disable-pip-version-check mcp==2.3.0
fi
# The agent tests check their scripted model API against the official openai and anthropic
# Python packages (request and response types), and drive /v1/agents with the openai client:
# pinned, in target/agent-venv (crates/runcell/tests/agent.rs looks for it).
if ! target/agent-venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit((m.version("openai"), m.version("anthropic")) != ("3.57.0", "2.14.0"))' 2>/dev/null; then
  echo "installing the Python openai and anthropic clients into target/agent-venv"
  rm -rf target/agent-venv
  /usr/bin/python3 -m venv target/agent-venv
  target/agent-venv/bin/pip install -q --disable-pip-version-check openai==3.57.0 anthropic==2.14.0
fi
# The HTTP tests check the OpenAPI document with openapi-spec-validator and /metrics with
# Prometheus' own Python parsers (classic and OpenMetrics): pinned, in target/validators-venv
# (crates/runcell/tests/http.rs looks for it).
# schemathesis too (crates/runcell/tests/agent.rs drives the whole HTTP API with it).
if ! target/validators-venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit((m.version("openapi-spec-validator"), m.version("prometheus_client"), m.version("schemathesis")) != ("0.9.0", "0.26.0", "4.32.5"))' 2>/dev/null; then
  echo "installing openapi-spec-validator, prometheus_client and schemathesis into target/validators-venv"
  rm -rf target/validators-venv
  /usr/bin/python3 -m venv target/validators-venv
  target/validators-venv/bin/pip install -q --disable-pip-version-check openapi-spec-validator==0.9.0 prometheus_client==0.26.0 schemathesis==4.32.5
fi
# The MCP tests also drive runcell with the official TypeScript SDK, pinned, in target/ts-mcp
# (crates/runcell/tests/mcp.rs looks for it; without npm the test reports itself ignored).
if [ ! -f target/ts-mcp/node_modules/@modelcontextprotocol/sdk/package.json ] \
  || ! grep -q '"version": "1.32.2"' target/ts-mcp/node_modules/@modelcontextprotocol/sdk/package.json; then
  if command -v npm >/dev/null; then
    echo "installing the TypeScript MCP SDK (1.32.2) into target/ts-mcp"
    mkdir -p target/ts-mcp
    npm install --silent --no-audit --no-fund --prefix target/ts-mcp @modelcontextprotocol/sdk@1.32.2 \
      || echo "test.sh: could not install the TypeScript MCP SDK; its test will be ignored"
  fi
fi
# The E2B tests drive runcell with the official E2B SDKs, pinned: the current releases in
# target/e2b-venv and the oldest that reach a sandbox by E2B_SANDBOX_URL in target/e2b-old-venv
# (crates/runcell/tests/e2b.rs looks for them).
if ! target/e2b-venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit((m.version("e2b"), m.version("e2b-code-interpreter")) != ("2.63.0", "2.11.5"))' 2>/dev/null; then
  echo "installing the E2B SDKs (e2b 2.63.0, e2b-code-interpreter 2.11.5) into target/e2b-venv"
  rm -rf target/e2b-venv
  /usr/bin/python3 -m venv target/e2b-venv
  target/e2b-venv/bin/pip install -q --disable-pip-version-check e2b==2.63.0 e2b-code-interpreter==2.11.5
fi
if ! target/e2b-old-venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit((m.version("e2b"), m.version("e2b-code-interpreter")) != ("2.26.0", "2.9.0"))' 2>/dev/null; then
  echo "installing the oldest E2B SDKs with sandbox URLs (e2b 2.26.0, e2b-code-interpreter 2.9.0, which needs e2b >= 2.26.0) into target/e2b-old-venv"
  rm -rf target/e2b-old-venv
  /usr/bin/python3 -m venv target/e2b-old-venv
  target/e2b-old-venv/bin/pip install -q --disable-pip-version-check e2b==2.26.0 e2b-code-interpreter==2.9.0
fi
# The agent-sandbox test drives runcell's agent-sandbox listener with the project's Python SDK,
# pinned, in target/agent-sandbox-venv (crates/runcell/tests/agent_sandbox.rs looks for it).
if ! target/agent-sandbox-venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("k8s-agent-sandbox") != "1.0.8")' 2>/dev/null; then
  echo "installing the agent-sandbox Python SDK (k8s-agent-sandbox 1.0.8) into target/agent-sandbox-venv"
  rm -rf target/agent-sandbox-venv
  /usr/bin/python3 -m venv target/agent-sandbox-venv
  target/agent-sandbox-venv/bin/pip install -q --disable-pip-version-check k8s-agent-sandbox==1.0.8
fi
# ... and with the official JS SDK, pinned, in target/e2b-js (without npm its test is ignored).
if [ ! -f target/e2b-js/node_modules/@e2b/code-interpreter/package.json ] \
  || ! grep -q '"version": "2.8.0"' target/e2b-js/node_modules/@e2b/code-interpreter/package.json; then
  if command -v npm >/dev/null; then
    echo "installing the E2B JS SDK (@e2b/code-interpreter 2.8.0) into target/e2b-js"
    mkdir -p target/e2b-js
    npm install --silent --no-audit --no-fund --prefix target/e2b-js @e2b/code-interpreter@2.8.0 \
      || echo "test.sh: could not install the E2B JS SDK; its test will be ignored"
  fi
fi
# The package-install tests serve a local index of one wheel, downloaded once from PyPI here
# (crates/runcell/tests/packages.rs looks for it).
if [ ! -f target/test-wheels/tabulate-0.9.0-py3-none-any.whl ]; then
  mkdir -p target/test-wheels
  /usr/bin/python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps \
    -d target/test-wheels tabulate==0.9.0
fi
phase_done setup
# The Kubernetes manifests and agent-sandbox resources (docs/kubernetes.md): rendered,
# schema-checked and policy-checked offline, with negative fixtures.
./scripts/k8s/validate.sh
phase_done k8s
# The tests' build scripts probe this host (build-support/host_probe.rs): with everything above
# installed, no test is ignored for a missing prerequisite, except those of the cgroup version
# the host does not have (on a v1 host, the v2 ones: the cgroup-v2-guest phase runs them).
cargo test --workspace
phase_done tests
# The attack, limit and isolation tests again with every CLI Python run's interpreter forked
# from a template (the server tests fork by default; docs/isolation.md, "Templates").
RUNCELL_TEMPLATES=true cargo test -p runcell --test isolation --test syscalls --test limits \
  --test network --test basics
phase_done tests-forked
# The documentation's examples: every shell and Python block of README.md, SECURITY.md and
# docs/ (not docs/reference/) runs against a live `runcell serve` of the debug build, and every
# JSON block must parse; `<!-- not-run: REASON -->` and `<!-- expect-fail -->` mark the
# exceptions (scripts/docs-examples.py's header has the rules). The runner checks itself on
# synthetic pages first.
/usr/bin/python3 scripts/docs-examples.py --self-test
/usr/bin/python3 scripts/docs-examples.py
phase_done docs
# A short soak (docs/soak.md): 400 mixed requests through a real `runcell serve` at concurrency
# 8, every answer checked, the server's memory flat after warm-up, nothing left on the host.
# It soaks the debug build the tests above used (the full soak, `scripts/soak.py`, builds and
# soaks the release one).
/usr/bin/python3 scripts/soak.py --profile debug --requests 400 --concurrency 8
phase_done soak
# The cgroup-dependent tests again on a real cgroup v2 kernel, in a qemu guest that sees this
# host's root read-only (the same test binaries, runtimes and `runcell setup` state). Prints a
# SKIP line where no guest can run, or with RUNCELL_SKIP_V2_GUEST=1.
./scripts/cgroup-v2-guest.sh
phase_done cgroup-v2-guest
# The container image and its permission matrix (docs/container.md): podman and runc from apt,
# configured under target/podman (nothing in /etc is edited). The image is made from the
# debug build the tests used (no release build here) and kept while its inputs are unchanged.
# Prints a SKIP line where podman cannot run, or with RUNCELL_SKIP_CONTAINER=1.
./scripts/image/suite.sh
phase_done container-matrix
