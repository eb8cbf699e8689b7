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
#
# Channel (fd 4, a unix socket to the sandbox's pid 1): this process writes "R\n" when ready;
# pid 1 sends "C\n" or "K <source path>\n" with the cell's stdin attached as a descriptor; this
# process answers "D <exit code>\n" when the cell is over. A one-shot cell's source file is
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
    try:
        chan.sendall(b"D %d\n" % (code & 0xFF))
        # pid 1 ends the run now; wait for it.
        while chan.recv(1):
            pass
    except OSError:
        pass
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
                    sys.displayhook(value)
            self.in_cell = False
        except SystemExit as e:
            code = _exit_code(e)
        except KeyboardInterrupt as e:
            _print_exception(e)
            code = 130
        except BaseException as e:
            _print_exception(e)
            code = 1
        self.in_cell = False
        try:
            _after_cell()
        except KeyboardInterrupt:
            pass
        if os.getpid() != me:
            # A child the cell forked that ran to the end of the cell: it never speaks for it.
            os._exit(code & 0xFF)
        return code


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
    for a syntax error in a cell): the traceback names only the user's code."""
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
