"""Run by runcell's setup with the new stack's own interpreter, after pip and compileall.

    <stack>/bin/python3 setup_stack.py <requirements.lock>

with MPLCONFIGDIR pointing at the directory whose files every sandbox gets a copy of.

1. Checks that the installed distributions are exactly the locked ones.
2. Imports every top-level package of the stack, and runcell_plots.
3. Builds matplotlib's font cache in MPLCONFIGDIR, keeping only fonts a sandbox can read:
   matplotlib's own (stored relative to its data path, so the cache stays valid when the
   stack directory is renamed) and world-readable files under /usr (bound read-only, at the
   same path, into every sandbox).
4. Checks that every module is byte-compiled: the stack is read-only in the sandbox and
   PYTHONDONTWRITEBYTECODE=1, so a missing .pyc would mean compiling on every import.

Prints one JSON object on the last line of stdout; exits non-zero with a message on stderr
when a check fails.
"""

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import stat
import sys
import sysconfig

TOP_LEVEL_MODULES = ["numpy", "pandas", "matplotlib", "scipy", "sympy", "PIL", "openpyxl"]


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path):
    """{normalized name: (name, version)} from a --require-hashes requirements file."""
    pins = {}
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = line.split()[0]
        name, sep, version = requirement.partition("==")
        if not sep:
            sys.exit(f"lock line is not pinned with ==: {line}")
        pins[normalize(name)] = (name, version)
    return pins


def check_distributions(pins):
    site = sysconfig.get_paths()["purelib"]
    installed = {}
    for dist in importlib.metadata.distributions(path=[site]):
        installed[normalize(dist.metadata["Name"])] = dist.version
    problems = []
    for key, (name, version) in sorted(pins.items()):
        got = installed.get(key)
        if got != version:
            problems.append(f"{name}: locked {version}, installed {got or 'nothing'}")
    for key in sorted(set(installed) - set(pins)):
        problems.append(f"{key} {installed[key]} is installed but not in the lock")
    if problems:
        sys.exit("installed distributions do not match the lock: " + "; ".join(problems))
    return sorted((pins[k][0], installed[k]) for k in pins)


def import_everything():
    for module in TOP_LEVEL_MODULES + ["matplotlib.pyplot", "runcell_plots"]:
        importlib.import_module(module)


def sandbox_readable(path):
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and bool(st.st_mode & stat.S_IROTH)


def build_font_cache():
    import matplotlib
    from matplotlib import font_manager

    data = os.path.realpath(matplotlib.get_data_path())
    fm = font_manager.fontManager
    dropped = []

    def keep(entry):
        fname = os.path.realpath(entry.fname)
        ok = sandbox_readable(fname) and (
            fname.startswith(data + os.sep) or fname.startswith("/usr/")
        )
        if not ok:
            dropped.append(entry.fname)
        return ok

    fm.ttflist = [e for e in fm.ttflist if keep(e)]
    fm.afmlist = [e for e in fm.afmlist if keep(e)]
    cache = os.path.join(
        matplotlib.get_cachedir(), f"fontlist-v{font_manager.FontManager.__version__}.json"
    )
    # Rewrite it even when nothing was dropped: the import above may have read an older file.
    font_manager.json_dump(fm, cache)
    if not os.path.isfile(cache):
        sys.exit(f"matplotlib did not write its font cache {cache}")
    return os.path.basename(cache), len(fm.ttflist) + len(fm.afmlist), sorted(set(dropped))


def check_bytecode():
    site = sysconfig.get_paths()["purelib"]
    missing = []
    for directory, _, files in os.walk(site):
        for name in files:
            if name.endswith(".py"):
                source = os.path.join(directory, name)
                if not os.path.isfile(importlib.util.cache_from_source(source)):
                    missing.append(os.path.relpath(source, site))
    if missing:
        sys.exit(f"{len(missing)} modules are not byte-compiled, e.g. {', '.join(missing[:5])}")


def main():
    pins = read_lock(sys.argv[1])
    packages = check_distributions(pins)
    import_everything()
    cache, fonts, dropped = build_font_cache()
    check_bytecode()
    print(
        json.dumps(
            {"packages": packages, "font_cache": cache, "fonts": fonts, "dropped_fonts": dropped}
        )
    )


if __name__ == "__main__":
    main()
