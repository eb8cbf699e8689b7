#!/usr/bin/env bash
# Issue 3's figures, in one run:
#  1. `import pandas, matplotlib` inside runcell vs. the bare host Python with the same stack
#     (runcell's fixed start-up cost measured alongside with `pass`);
#  2. Go hello-world build-and-run in runcell with the prepared build cache vs. without it
#     (an empty data directory), and the same for a program importing net/http.
# Needs `runcell setup` to have run. Usage: benches/datastack.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
command -v hyperfine >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine >/dev/null; }
cargo build --release -q
rc=target/release/runcell
$rc setup >/dev/null 2>&1
py=$($rc doctor --json | python3 -c 'import json,sys; print([r for r in json.load(sys.stdin)["runtimes"] if r["language"]=="python"][0]["executable"])')
clean="env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8"
empty=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$empty" "$out"' EXIT
imp='import pandas, matplotlib'
hyperfine -N -w 2 -r "$runs" --export-json "$out/py.json" \
  -n bare-pass "$clean $py -c pass" \
  -n bare-import "$clean MPLBACKEND=Agg MPLCONFIGDIR=/tmp/rc-bench-mpl $py -c '$imp'" \
  -n runcell-pass "$clean $rc run --json -c pass" \
  -n runcell-import "$clean $rc run --json -c '$imp'" >/dev/null
hello='package main
import "fmt"
func main() { fmt.Println("hi") }'
web='package main
import ("fmt"; "net/http")
func main() { fmt.Println(http.StatusOK) }'
printf '%s' "$hello" > "$out/hello.go"; printf '%s' "$web" > "$out/web.go"
hyperfine -N -w 1 -r "$runs" --export-json "$out/go.json" \
  -n hello-cache "$rc run --json $out/hello.go" \
  -n hello-nocache "$rc run --json --data-dir $empty $out/hello.go" \
  -n web-cache "$rc run --json $out/web.go" \
  -n web-nocache "$rc run --json --data-dir $empty --timeout 60 --compile-timeout 120 $out/web.go" >/dev/null
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
r = {x["command"]: x["mean"] * 1000 for f in ("py.json", "go.json") for x in json.load(open(os.path.join(d, f)))["results"]}
fixed = r["runcell-pass"] - r["bare-pass"]
extra = r["runcell-import"] - r["bare-import"]
print(f"import pandas, matplotlib: bare {r['bare-import']:.0f} ms, runcell {r['runcell-import']:.0f} ms")
print(f"  runcell's fixed start-up cost (pass vs pass): {fixed:.0f} ms")
print(f"  import overhead beyond that: {extra - fixed:.0f} ms = {100 * (extra - fixed) / r['bare-import']:.1f}% of the bare import (target: within 10%)")
print(f"go hello world build+run: {r['hello-cache']:.0f} ms with the prepared cache, {r['hello-nocache']:.0f} ms without ({r['hello-nocache'] / r['hello-cache']:.1f}x)")
print(f"go net/http build+run:    {r['web-cache']:.0f} ms with the prepared cache, {r['web-nocache']:.0f} ms without ({r['web-nocache'] / r['web-cache']:.1f}x)")
PY
