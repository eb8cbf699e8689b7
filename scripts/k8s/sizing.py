"""The memory a runcell pod must be given, from its runcell.toml (docs/kubernetes.md, "Sizing").

In the unprivileged shape runcell has no cgroup of its own: every byte a run, a warm sandbox
or an idle session holds (their tmpfs disk included: tmpfs pages are memory) is charged to the
pod's container, and when the container reaches its limit the kernel kills the container's
processes (with memory.oom.group, all of them: the server and every session). So the limit
must hold the worst case runcell admits:

    limit >= base + body + P*w + c*(m + d) + S*(m + d) + headroom

  base      the server itself (BASE_MIB)
  body      the request bodies runcell may hold: (max_concurrent + max_queue) * max_body
  P*w       the warm pool: per language, its size times the working set of one warm sandbox
  c*(m+d)   max_concurrent one-shot runs at the largest memory and disk limits (limits.max)
  S*(m+d)   sessions.max idle sessions, each holding its limits (at most limits.max)
  headroom  10 % of the sum, at least 128 MiB (page cache, allocator slack, refills in flight)

A session's call runs in its own sandbox (counted in S) and takes a place among
max_concurrent, so c and S do not count the same run twice. The per-sandbox working sets are
measured by benches/capacity.py, which checks them against the figures below.

Used by scripts/k8s/validate.py (the policy check) and benches/capacity.py.
"""

import math

MIB = 1 << 20

# The server process with its tables, before any sandbox (measured: benches/capacity.py's
# intercept of memory over pool size).
BASE_MIB = 32
# Working set of one warm sandbox waiting for a request (benches/capacity.py: the slope of
# the pod's memory over the pool's size). Python with numpy, pandas and matplotlib.pyplot
# preloaded measured 71 MiB on the reference machine; bare interpreters a few MiB.
WARM_PRELOADED_MIB = 80
WARM_BARE_MIB = 8
HEADROOM_FRACTION = 0.10
HEADROOM_MIN_MIB = 128

# runcell's defaults (crates/runcell-core/src/limits.rs, policy.rs; docs/serve.md).
DEFAULT_CAPS = {"code": 1 << 20, "stdin": 16 << 20, "input_total": 64 << 20}
DEFAULT_MAX_SESSIONS = 32


class SizingError(Exception):
    """The settings do not bound what runcell admits."""


def parse_size(value):
    """Bytes from a runcell size: 65536, "256M", "1.5G" (K, M, G, T are powers of 1024)."""
    if isinstance(value, (int, float)):
        return int(value)
    t = str(value).strip()
    i = 0
    while i < len(t) and (t[i].isdigit() or t[i] == "."):
        i += 1
    num, unit = t[:i], t[i:].strip().lower()
    if not num:
        raise SizingError(f"'{value}' is not a size")
    mult = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
            "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
            "tib": 1 << 40}.get(unit)
    if mult is None:
        raise SizingError(f"unknown size unit in '{value}'")
    return round(float(num) * mult)


def parse_quantity(q):
    """Bytes from a Kubernetes memory quantity (7Gi, 512Mi, 1G, 1e9, 1000000)."""
    t = str(q).strip()
    suffixes = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
                "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
    for s, mult in suffixes.items():
        if t.endswith(s):
            return int(float(t[: -len(s)]) * mult)
    return int(float(t))


def default_max_body(caps):
    """runcell's default body cap: code, stdin, the input files base64-encoded, 1 MiB."""
    code = parse_size(caps.get("code", DEFAULT_CAPS["code"]))
    stdin = parse_size(caps.get("stdin", DEFAULT_CAPS["stdin"]))
    total = parse_size(caps.get("input_total", DEFAULT_CAPS["input_total"]))
    return code + stdin + math.ceil(total / 3) * 4 + (1 << 20)


def required_memory(settings, cores):
    """The pod memory limit `settings` (a parsed runcell.toml) needs, in bytes, and the terms.

    `cores` is the pod's CPU limit (runcell's default max_concurrent and pool follow it).
    """
    c = int(settings.get("max_concurrent", max(1, cores)))
    q = int(settings.get("max_queue", 4 * c))
    body = parse_size(settings["max_body"]) if "max_body" in settings else default_max_body(settings.get("caps", {}))
    maxima = settings.get("limits", {}).get("max", {})
    missing = [k for k in ("memory", "disk") if k not in maxima]
    if missing:
        # runcell derives them from the memory it sees and shares it among max_concurrent,
        # which leaves sessions on top: name them, so the pod can be sized.
        raise SizingError(
            "set [limits.max] " + " and ".join(missing) + " in runcell.toml: the pod's memory limit "
            "must hold max_concurrent runs and sessions.max sessions at those limits"
        )
    per_run = parse_size(maxima["memory"]) + parse_size(maxima["disk"])
    pool = settings.get("pool")
    if pool is None:
        pool = {"python": min(4, max(1, cores // 2), c)}
    preload = settings.get("preload", {})
    warm = 0
    for language, n in pool.items():
        w = WARM_PRELOADED_MIB if preload.get(language) else WARM_BARE_MIB
        warm += int(n) * w * MIB
    sessions = int(settings.get("sessions", {}).get("max", DEFAULT_MAX_SESSIONS))
    terms = {
        "base": BASE_MIB * MIB,
        "body": (c + q) * body,
        "pool": warm,
        "runs": c * per_run,
        "sessions": sessions * per_run,
    }
    subtotal = sum(terms.values())
    terms["headroom"] = max(int(subtotal * HEADROOM_FRACTION), HEADROOM_MIN_MIB * MIB)
    return sum(terms.values()), terms


def describe(terms):
    return " + ".join(f"{k} {v / MIB:.0f}" for k, v in terms.items()) + f" = {sum(terms.values()) / MIB:.0f} MiB"
