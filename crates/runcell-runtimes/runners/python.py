# runcell's warm Python interpreter: started in a sandbox before a request arrives, it imports
# the operator's preload modules, says it is ready, and then runs either
# * one one-shot cell ("C"), as `python3 /workspace/main.py` would: `__main__`, sys.argv,
#   sys.path[0], stdin, tracebacks that name the user's file and line, `sys.exit` codes,
#   threads joined and atexit handlers (the plots hook among them) run at the end, death by
#   SIGINT for an uncaught KeyboardInterrupt; or
# * any number of a session's cells ("K <source>"), like a notebook kernel: one `__main__`
#   namespace for all of them (variables, imports and definitions persist), the value of a
#   final expression displayed, tracebacks that name the cell ("<cell 3>") and its lines,
#   open figures saved after each cell, `sys.exit(n)` ending the cell (not the session) with
#   exit code n, and SIGINT (a timeout) raising KeyboardInterrupt in the cell only.
#   Like a notebook, a session cell's displayed results (the final expression's value,
#   `display(obj)`, figures) and its exception are reported as MIME bundles in
#   /tmp/.runcell-results.json, which the host reads after the cell (docs/results.md); a
#   call's own environment variables come in /tmp/.runcell-env and are undone after it.
#
# Channel (fd 4, a unix socket to the sandbox's pid 1): this process writes "R\n" when ready;
# pid 1 sends "C\n" or "K <source path>\n" with the cell's stdin attached as a descriptor; this
# process answers "D <exit code>\n" when a session's cell is over (a one-shot cell closes the
# channel before the program runs, and its end is the interpreter's exit). A one-shot cell's source file is
# argv[1] (/workspace/main.py); argv[2:] are the modules to preload.
import sys


def _runcell_main():
    import os
    import signal
    import socket

    chan = socket.socket(fileno=4)
    me = os.getpid()
    path = sys.argv[1]
    for name in sys.argv[2:]:
        __import__(name)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.set_inheritable(4, False)
    chan.sendall(b"R\n")
    session = None
    while True:
        # Between cells a late SIGINT (a timeout that crossed the cell's end) is ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        msg, fds, _flags, _addr = socket.recv_fds(chan, 4096, 1)
        if not msg:
            os._exit(0)
        if not msg.endswith(b"\n") or len(fds) != 1:
            os._exit(125)
        # The cell's stdin under the interpreter's own fd 0.
        os.dup2(fds[0], 0)
        os.close(fds[0])
        if msg == b"C\n" and session is None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _one_shot(chan, me, path)
        elif msg.startswith(b"K "):
            if session is None:
                session = _Session(os.path.dirname(path))
            code = session.run(os.fsdecode(msg[2:-1]), me)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            chan.sendall(b"D %d\n" % (code & 0xFF))
        else:
            os._exit(125)


def _one_shot(chan, me, path):
    """Run `path` as the program of a one-shot request; never returns."""
    import os
    import types

    # The program sees only fds 0-2, as `python3 main.py` would: the channel is closed, and
    # the cell's end is the interpreter's exit (pid 1 waits for it).
    chan.close()
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = [path]
    sys.path[0] = os.path.dirname(path)
    code = 0
    interrupted = False
    try:
        with open(path, "rb") as fh:
            source = fh.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        _print_exception(e)
        code = 1
    _shutdown()
    if os.getpid() != me:
        # A process the cell forked that ran to the end of its code: it exits as such a
        # child of `python3 main.py` would, and never speaks for the cell.
        os._exit(code & 0xFF)
    if interrupted:
        # As CPython does: die by SIGINT, so the status says so.
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(me, signal.SIGINT)
    os._exit(code & 0xFF)


class _Session:
    """The state of a session: one `__main__` for every cell."""

    def __init__(self, workdir):
        import types

        main = types.ModuleType("__main__")
        main.__builtins__ = __builtins__
        main.__cached__ = None
        sys.modules["__main__"] = main
        sys.argv = [""]
        sys.path[0] = workdir
        self.main = main
        self.count = 0
        self.in_cell = False
        self.shown = None
        # `display` as a builtin, as in a notebook (IPython is not in the stack; its
        # `IPython.display` works only where a cell installs IPython).
        import builtins

        builtins.display = self.display
        # Every figure runcell_plots saves (plt.show(), or open at the cell's end) becomes a
        # result too. Its module is part of the installed stack (whose id hashes it), so it is
        # wrapped here, when it is first imported, rather than changed.
        plots = sys.modules.get("runcell_plots")
        if plots is not None:
            _wrap_plots(plots, self._on_figure)
        else:
            sys.meta_path.insert(0, _PlotsFinder(self._on_figure))

    def display(self, *objs, raw=False, **_kwargs):
        """Display objects as the cell's results, each a MIME bundle (with `raw=True`, each
        object is a bundle already: a dict of MIME type to content, as IPython's)."""
        shown = self.shown
        if shown is None:
            return
        for obj in objs:
            if raw and isinstance(obj, dict):
                shown.add_bundle(obj, False)
            else:
                shown.add(obj, False)

    def _on_figure(self, figure, path):
        shown = self.shown
        if shown is None or id(figure) in shown.figures:
            return
        import os

        # The file runcell_plots has just written, read back within the cap.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                png = fh.read(RESULTS_MAX_BYTES + 1)
        except OSError:
            return
        if len(png) > RESULTS_MAX_BYTES:
            shown.dropped += 1
            return
        shown.add_figure(figure, png, False)

    def _on_sigint(self, signum, frame):
        # Ctrl-C (a timeout, an output flood, a cancellation) interrupts the cell's code only.
        if self.in_cell:
            raise KeyboardInterrupt

    def run(self, source_path, me):
        """Run the cell at `source_path`; its exit code (0, sys.exit's, 1 for an exception,
        130 for an interruption)."""
        import os

        import signal

        self.count += 1
        name = "<cell %d>" % self.count
        code = 0
        # Nothing of an earlier cell's report is ever read for this one.
        _unlink(RESULTS_PATH)
        self.shown = _Shown()
        restore = _apply_env(_take_env())
        self.in_cell = True
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            with open(source_path, "rb") as fh:
                source = fh.read()
            os.unlink(source_path)
            # A new text layer over fd 0 (the cell's stdin), nothing buffered from before.
            sys.stdin = open(0, "r", closefd=False, encoding="utf-8", errors="surrogateescape")
            _remember(name, source)
            body, last = _split(source, name)
            exec(body, self.main.__dict__)
            if last is not None:
                value = eval(last, self.main.__dict__)
                if value is not None:
                    # A result, as a notebook's `execute_result`; and printed, as runcell's
                    # sessions always did (stdout keeps the value), unless the session's
                    # environment says RUNCELL_PRINT_RESULT=0: a notebook's behaviour (E2B's
                    # sandboxes set it), the value then only in `_` and the results.
                    if os.environ.get("RUNCELL_PRINT_RESULT") == "0":
                        import builtins

                        builtins._ = value
                    else:
                        sys.displayhook(value)
                    self.shown.add(value, True)
            self.in_cell = False
        except SystemExit as e:
            code = _exit_code(e)
        except KeyboardInterrupt as e:
            self.shown.exception = _print_exception(e)
            code = 130
        except BaseException as e:
            self.shown.exception = _print_exception(e)
            code = 1
        self.in_cell = False
        try:
            _after_cell()
        except KeyboardInterrupt:
            pass
        if os.getpid() != me:
            # A child the cell forked that ran to the end of the cell: it never speaks for it.
            os._exit(code & 0xFF)
        _restore_env(restore)
        shown, self.shown = self.shown, None
        try:
            shown.write(RESULTS_PATH)
        except BaseException as e:
            try:
                print("runcell: the cell's results could not be reported: %r" % (e,), file=sys.stderr)
            except Exception:
                pass
        return code


class _PlotsFinder:
    """Wraps runcell_plots (see `_wrap_plots`) when a cell first imports it."""

    def __init__(self, on_figure):
        self.on_figure = on_figure
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if name != "runcell_plots" or self.done:
            return None
        self.done = True
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        on_figure = self.on_figure

        def exec_module(module):
            run(module)
            _wrap_plots(module, on_figure)

        loader.exec_module = exec_module
        return spec


def _wrap_plots(plots, on_figure):
    """Hand every figure runcell_plots saves (its `_save(figure) -> path or None`) to
    `on_figure(figure, path)`."""
    save = getattr(plots, "_save", None)
    if save is None or getattr(save, "_runcell_wrapped", False):
        return

    def _save(figure):
        path = save(figure)
        if path is not None:
            try:
                on_figure(figure, path)
            except Exception:
                pass
        return path

    _save._runcell_wrapped = True
    plots._save = _save


# Where a session cell's results are reported (the host reads this file after the cell), and
# where a call's own environment variables are given (NAME=value entries, each ended by NUL).
RESULTS_PATH = "/tmp/.runcell-results.json"
ENV_PATH = "/tmp/.runcell-env"
# The most bytes of results a cell reports (the host's cap is the same): past it, results
# are left out and counted.
RESULTS_MAX_BYTES = 8 << 20
RESULTS_MAX_COUNT = 100

# (method, MIME type) in the order a notebook asks for them.
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
)


class _Shown:
    """What a cell displayed, in order, within the caps; and its exception."""

    def __init__(self):
        self.results = []
        self.size = 0
        self.dropped = 0
        self.exception = None
        self.figures = set()

    def add(self, obj, main):
        if _is_figure(obj):
            import io

            buf = io.BytesIO()
            try:
                obj.savefig(buf, format="png")
            except Exception:
                return
            self.add_figure(obj, buf.getvalue(), main)
            return
        self._push(_bundle(obj), main)

    def add_bundle(self, bundle, main):
        data = {k: v for k, v in bundle.items() if isinstance(k, str)}
        if not isinstance(data.get("text/plain"), str):
            data["text/plain"] = _plain(bundle)
        self._push(data, main)

    def add_figure(self, figure, png, main):
        # A figure displayed already (as the last value, or by display()) is saved at the
        # cell's end as a file, but not shown twice.
        if id(figure) in self.figures:
            return
        self.figures.add(id(figure))
        import base64

        data = {"text/plain": _plain(figure)}
        if _figure_format(figure) == "svg":
            import io

            buf = io.BytesIO()
            try:
                figure.savefig(buf, format="svg")
                data["image/svg+xml"] = buf.getvalue().decode("utf-8", "replace")
            except Exception:
                pass
        if "image/svg+xml" not in data:
            data["image/png"] = base64.b64encode(png).decode("ascii")
        self._push(data, main)

    def _push(self, data, main):
        if not data:
            return
        import json

        if len(self.results) >= RESULTS_MAX_COUNT or self.size + sum(
            len(v) for v in data.values() if isinstance(v, str)
        ) > RESULTS_MAX_BYTES:
            # (Known too large before it is serialised: a huge repr is not copied again.)
            self.dropped += 1
            return
        item = {"is_main_result": bool(main), "data": data}
        try:
            size = len(json.dumps(item, ensure_ascii=False).encode("utf-8", "replace"))
        except Exception:
            self.dropped += 1
            return
        if len(self.results) >= RESULTS_MAX_COUNT or self.size + size > RESULTS_MAX_BYTES:
            self.dropped += 1
            return
        self.size += size
        self.results.append(item)

    def write(self, path):
        """The report, written whole under a temporary name first, so the host never reads
        half of one."""
        import json
        import os

        report = {"results": self.results, "exception": self.exception, "dropped": self.dropped}
        # (A lone surrogate, from bytes decoded with surrogateescape, becomes "?": the host
        # reads UTF-8 only.)
        data = json.dumps(report, ensure_ascii=False).encode("utf-8", "replace")
        tmp = path + ".tmp"
        _unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)


def _is_figure(obj):
    t = type(obj)
    return getattr(t, "__module__", "") == "matplotlib.figure" and hasattr(obj, "savefig")


def _figure_format(figure):
    """`svg` when the session asked for SVG figures (matplotlib's own `savefig.format`)."""
    try:
        import matplotlib

        return str(matplotlib.rcParams.get("savefig.format", "png")).lower()
    except Exception:
        return "png"


def _plain(obj):
    try:
        return repr(obj)
    except BaseException as e:
        return "<%s object (repr failed: %s)>" % (type(obj).__name__, type(e).__name__)


def _bundle(obj):
    """A notebook's MIME bundle for `obj`: `text/plain` always, plus what its `_repr_*_`
    methods and `_repr_mimebundle_` offer. A method that fails is left out."""
    import base64
    import json

    data = {}
    if isinstance(obj, type):
        # A class is shown by its repr (its `_repr_*_` are unbound functions).
        return {"text/plain": _plain(obj)}
    offered = {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method):
        try:
            got = method(include=None, exclude=None)
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                offered.update(got)
        except Exception:
            pass
    for name, mime in _REPR_METHODS:
        if mime in offered:
            continue
        method = getattr(obj, name, None)
        if not callable(method):
            continue
        try:
            got = method()
        except Exception:
            continue
        if isinstance(got, tuple):
            got = got[0] if got else None
        if got is not None:
            offered[mime] = got
    for mime, value in offered.items():
        if not isinstance(mime, str):
            continue
        if mime in ("image/png", "image/jpeg", "image/gif"):
            if isinstance(value, (bytes, bytearray)):
                value = base64.b64encode(bytes(value)).decode("ascii")
            if not isinstance(value, str):
                continue
        elif mime == "application/json" or mime.endswith("+json"):
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    continue
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif not isinstance(value, str):
            continue
        data[mime] = value
    if not isinstance(data.get("text/plain"), str):
        data["text/plain"] = _plain(obj)
    return data


def _unlink(path):
    import os

    try:
        os.unlink(path)
    except OSError:
        pass


def _take_env():
    """The call's own environment variables (NAME=value entries, each ended by NUL), if it
    has any; the file is removed."""
    import os

    try:
        fd = os.open(ENV_PATH, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(1 << 20)
    finally:
        _unlink(ENV_PATH)
    pairs = []
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            pairs.append((name, value))
    return pairs


def _apply_env(pairs):
    """Set the call's variables; what to put back after the call."""
    import os

    restore = []
    for name, value in pairs:
        restore.append((name, os.environb.get(name)))
        os.environb[name] = value
    return restore


def _restore_env(restore):
    import os

    for name, old in reversed(restore):
        if old is None:
            os.environb.pop(name, None)
        else:
            os.environb[name] = old


def _remember(name, source):
    """Keep the cell's lines for tracebacks (a cell has no file to read them from)."""
    import linecache

    text = source.decode("utf-8", "replace")
    if not text.endswith("\n"):
        # (Without it, the markers under the failing expression are one column off.)
        text += "\n"
    linecache.cache[name] = (len(text), None, text.splitlines(True), name)


def _split(source, name):
    """The cell compiled as its statements and, when it ends with an expression, that
    expression apart (its value is displayed, as a notebook does)."""
    import ast

    tree = ast.parse(source, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), name, "eval")
    return compile(tree, name, "exec"), last


def _print_exception(e):
    """Print `e` as an uncaught exception, without this runner's frames (nor the parser's,
    for a syntax error in a cell): the traceback names only the user's code. Returns the
    exception's report (name, value, traceback)."""
    import ast
    import traceback

    hidden = {_runcell_main.__code__.co_filename, ast.__file__}
    frames = []
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename not in hidden:
            frames.append(tb)
        tb = tb.tb_next
    for this, after in zip(frames, frames[1:] + [None]):
        this.tb_next = after
    tb = frames[0] if frames else None
    e.__traceback__ = tb
    if sys.excepthook is sys.__excepthook__:
        # (The built-in hook reads source lines from files; a cell's are in linecache.)
        traceback.print_exception(type(e), e, tb)
    else:
        sys.excepthook(type(e), e, tb)
    # The exception as a session reports it (name, value, the traceback as printed).
    try:
        value = str(e)
    except BaseException:
        value = "<unprintable %s>" % type(e).__name__
    try:
        text = "".join(traceback.format_exception(type(e), e, tb))
    except BaseException:
        text = ""
    return {"name": type(e).__name__, "value": value, "traceback": text}


def _after_cell():
    """What ends a session's cell: its open figures are saved (as at a program's exit), and
    its output is flushed."""
    plots = sys.modules.get("runcell_plots")
    if plots is not None:
        plots._at_exit()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c
    try:
        print(c, file=sys.stderr)
    except Exception:
        pass
    return 1


def _shutdown():
    """What the interpreter does at exit: join non-daemon threads, run atexit handlers (whose
    exceptions it reports and ignores), flush."""
    import atexit

    # As CPython's own shutdown: threads are joined only where `threading` was imported (by
    # the cell or a module it imported); importing it here would cost the cell a millisecond.
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


_runcell_main()
