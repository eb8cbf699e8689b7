# runcell's warm Python interpreter: started in a sandbox before a request arrives, it imports
# the operator's preload modules, says it is ready, and runs one cell when told to, as
# `python3 /workspace/main.py` would: `__main__`, sys.argv, sys.path[0], stdin, tracebacks that
# name the user's file and line, `sys.exit` codes, threads joined and atexit handlers (the
# plots hook among them) run at the end, death by SIGINT for an uncaught KeyboardInterrupt.
#
# Channel (fd 4, a unix socket to the sandbox's pid 1): this process writes "R\n" when ready;
# pid 1 sends "C\n" with the cell's stdin attached as a descriptor; this process answers
# "D <exit code>\n" when the cell is over. The source file (argv[1], /workspace/main.py) is
# written by pid 1 with the cell; argv[2:] are the modules to preload.
import sys


def _runcell_main():
    import os
    import socket

    chan = socket.socket(fileno=4)
    me = os.getpid()
    path = sys.argv[1]
    for name in sys.argv[2:]:
        __import__(name)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    chan.sendall(b"R\n")
    msg, fds, _flags, _addr = socket.recv_fds(chan, 16, 1)
    if not msg.startswith(b"C") or len(fds) != 1:
        os._exit(125)
    # The cell's stdin under the interpreter's own sys.stdin (nothing was read from it yet).
    os.dup2(fds[0], 0)
    os.close(fds[0])
    os.set_inheritable(4, False)

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
        # The first frame is this runner's; the traceback starts at the user's file.
        tb = e.__traceback__
        e.__traceback__ = tb.tb_next if tb is not None else None
        sys.excepthook(type(e), e, e.__traceback__)
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
    import threading

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
