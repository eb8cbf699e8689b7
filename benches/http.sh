#!/usr/bin/env bash
# The HTTP API under load, in one run: `print(1)` through `runcell serve` (with an API key) at
# concurrency 1, 2 and 8 with oha, each level capped in requests and in time; against the CLI's
# cold run (`runcell run -c 'print(1)'`) and the bare host Python (`python3 -c 'print(1)'`).
# Prints throughput and p50/p99 latency of the 200s, non-200s and transport errors per level,
# and the ratio server p50 (c=1) / CLI cold median. The server gets max-concurrent = cores and
# a queue of 16, so concurrency 8 queues rather than gets 429s; any 429 is counted as an error.
# Needs root or user namespaces, like runcell itself. oha is built once into target/bench-tools
# (`cargo install`, a few minutes on 2 cores) unless one is on PATH.
# Usage: benches/http.sh [--json] [requests per level, default 500] [cold runs, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
json=0
if [[ ${1:-} == --json ]]; then json=1; shift; fi
requests=${1:-500}
runs=${2:-20}
cap=60 # seconds per load level
levels=(1 2 8)
cores=$(nproc)
queue=16

command -v hyperfine >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine >/dev/null; }
oha=$(command -v oha || true)
if [[ -z $oha ]] || ! "$oha" --help | grep -q -- --stats-success-breakdown; then
  oha=target/bench-tools/bin/oha
  if [[ ! -x $oha ]]; then
    echo "http.sh: installing oha into target/bench-tools (once)" >&2
    cargo install -q oha --version '~1.16' --locked --root target/bench-tools
  fi
fi
cargo build --release -q -p runcell
rc=target/release/runcell
clean="env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8"
loadavg=$(cut -d' ' -f1 /proc/loadavg) # other work on the host skews every figure: say so
py=$($rc doctor --json | python3 -c 'import json,sys; print([r for r in json.load(sys.stdin)["runtimes"] if r["language"]=="python"][0]["executable"])')

out=$(mktemp -d)
server=
cleanup() {
  if [[ -n $server ]] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server"; fi
  rm -rf "$out"
}
trap cleanup EXIT
die() { echo "http.sh: $*" >&2; [[ -f $out/server.log ]] && sed 's/^/  server: /' "$out/server.log" >&2; exit 1; }

# 1. Cold runs: the CLI and the bare interpreter, one process per run.
[[ $($clean $rc run -c 'print(1)' 2>/dev/null) == 1 ]] || die "runcell run -c 'print(1)' did not print 1"
hyperfine -N -w 3 -r "$runs" --export-json "$out/cold.json" \
  -n bare "$clean $py -c 'print(1)'" \
  -n cli "$clean $rc run -c 'print(1)'" >/dev/null

# 2. The server, on a free loopback port, with a throwaway API key.
key=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
$clean RUNCELL_API_KEY="$key" $rc serve --listen 127.0.0.1:0 --max-concurrent "$cores" \
  --max-queue "$queue" 2>"$out/server.log" &
server=$!
base=
for _ in $(seq 100); do
  base=$(grep -o 'listening on http://[0-9.:]*' "$out/server.log" | cut -d' ' -f3 || true)
  [[ -n $base ]] && curl -fsS "$base/healthz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || die "the server exited at start-up"
  base=
  sleep 0.1
done
[[ -n $base ]] || die "the server did not answer /healthz within 10 s"
body='{"language":"python","code":"print(1)"}'
auth="Authorization: Bearer $key"
check() { # a real verdict: stdout "1\n", exit code 0
  curl -sS -H "$auth" -H 'Content-Type: application/json' -d "$body" "$base/v1/execute" |
    python3 -c 'import json,sys; v=json.load(sys.stdin); sys.exit(0 if v.get("stdout")=="1\n" and v.get("exit_code")==0 else 1)' ||
    die "POST /v1/execute did not return stdout \"1\\n\" and exit_code 0"
}
check
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "$base/v1/execute")
[[ $code == 401 ]] || die "a request without the API key got $code, not 401"

# 3. Load: each level capped at $requests requests and $cap seconds (SIGINT makes oha stop and
# still report). One oha worker thread: the load is light and the cores are the server's.
load() { # name, concurrency, requests
  local s=0
  timeout -s INT -k 10 "$cap" "$oha" --no-tui --worker-threads 1 -n "$3" -c "$2" -t 30s -m POST \
    -T application/json -H "$auth" -d "$body" --output-format json --stats-success-breakdown \
    "$base/v1/execute" >"$out/$1.json" || s=$?
  [[ $s == 0 || $s == 124 ]] || die "oha failed ($s) at concurrency $2"
  [[ $s == 0 ]] || touch "$out/$1.capped"
}
load warmup 1 10
for c in "${levels[@]}"; do load "c$c" "$c" "$requests"; done
check # still serving real verdicts after the load

# 4. Stop: SIGTERM, a clean exit within the grace period (30 s by default).
t0=$(date +%s%N)
kill -TERM "$server"
for _ in $(seq 400); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
kill -0 "$server" 2>/dev/null && die "the server did not exit within 40 s of SIGTERM"
status=0
wait "$server" || status=$?
server=
stop_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[[ $status == 0 ]] || die "the server exited with $status after SIGTERM"
grep -q 'runcell serve: stopped' "$out/server.log" || die "the server did not log a clean stop"

python3 - "$out" "$json" "$requests" "$cap" "$cores" "$queue" "$stop_ms" "$loadavg" "${levels[@]}" <<'PY'
import json, math, os, sys
d, as_json, requests, cap, cores, queue, stop_ms, loadavg = sys.argv[1:9]
levels = [int(c) for c in sys.argv[9:]]

def pct(xs, p):  # nearest rank
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]

rows = []
for c in levels:
    r = json.load(open(os.path.join(d, f"c{c}.json")))
    codes = {int(k): v for k, v in r.get("statusCodeDistribution", {}).items()}
    transport = sum(r.get("errorDistribution", {}).values())
    ok = codes.get(200, 0)
    lat = r.get("latencyPercentilesSuccessful") or {}
    wall = r["summary"]["total"]
    rows.append({
        "mode": "server", "concurrency": c, "requests": sum(codes.values()) + transport, "ok": ok,
        "throughput_rps": ok / wall if wall else 0.0,
        "p50_ms": lat["p50"] * 1000 if ok and lat.get("p50") is not None else None,
        "p99_ms": lat["p99"] * 1000 if ok and lat.get("p99") is not None else None,
        "errors": sum(v for k, v in codes.items() if k != 200) + transport,
        "status_429": codes.get(429, 0),
        "non_200": {str(k): v for k, v in codes.items() if k != 200},
        "transport_errors": r.get("errorDistribution", {}),
        "time_capped": os.path.exists(os.path.join(d, f"c{c}.capped")),
    })
cold = {x["command"]: x for x in json.load(open(os.path.join(d, "cold.json")))["results"]}
for name in ("cli", "bare"):
    t = cold[name]["times"]
    rows.append({
        "mode": name, "concurrency": 1, "requests": len(t), "ok": len(t),
        "throughput_rps": len(t) / sum(t), "p50_ms": pct(t, 50) * 1000,
        "p99_ms": pct(t, 99) * 1000, "errors": 0, "status_429": 0,
    })
by = {(r["mode"], r["concurrency"]): r for r in rows}
s1, cli, bare = by[("server", 1)], by[("cli", 1)], by[("bare", 1)]
ratio = s1["p50_ms"] / cli["p50_ms"] if s1["p50_ms"] else None
result = {
    "server": {"max_concurrent": int(cores), "max_queue": int(queue), "auth": "api key",
               "requests_per_level": int(requests), "cap_seconds": int(cap),
               "stop_after_sigterm_ms": int(stop_ms), "exit_code": 0},
    "host": {"cores": int(cores), "load_average_at_start": float(loadavg)},
    "rows": rows,
    "cli_cold_median_ms": cli["p50_ms"], "cli_cold_p99_ms": cli["p99_ms"],
    "bare_python_median_ms": bare["p50_ms"],
    "server_p50_c1_over_cli_cold_median": ratio,
}
if as_json == "1":
    print(json.dumps(result, indent=2))
    sys.exit(0)
f = lambda v: "-" if v is None else f"{v:.1f}"
print(f"print(1): runcell serve ({cores} at once, queue {queue}, API key) vs. the CLI's cold run "
      f"vs. bare python; {requests} requests or {cap} s per level; load average at start {loadavg}")
print(f"{'mode':7} {'conc':>4} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  errors")
for r in rows:
    err = str(r["errors"])
    if r["errors"]:
        err += " (" + ", ".join([f"{k}: {v}" for k, v in r["non_200"].items()] +
                                [f"{k}: {v}" for k, v in r["transport_errors"].items()]) + ")"
    if r.get("time_capped"):
        err += f"  [stopped at the {cap} s cap]"
    print(f"{r['mode']:7} {r['concurrency']:4} {r['requests']:8} {r['throughput_rps']:8.1f} "
          f"{f(r['p50_ms']):>8} {f(r['p99_ms']):>8}  {err}")
print(f"CLI cold run: median {cli['p50_ms']:.1f} ms, p99 {cli['p99_ms']:.1f} ms; "
      f"bare python median {bare['p50_ms']:.1f} ms")
print(f"server p50 (c=1) / CLI cold median: " + ("-" if ratio is None else f"{ratio:.2f}x"))
print(f"server: 429s {sum(r['status_429'] for r in rows)}; SIGTERM to clean exit (0) in {int(stop_ms)} ms")
PY
