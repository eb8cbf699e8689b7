# runcell's warm Python interpreter: started in a sandbox before a request arrives, it imports
# the operator's preload modules, says it is ready, and runs one cell when told to, as
# `python3 /workspace/main.py` would: `__main__`, sys.argv, sys.path[0], stdin, tracebacks that
# name the user's file and line, `sys.exit` codes, threads joined and atexit handlers (the
# plots hook among them) run at the end.
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
    path = sys.argv[1]
    for name in sys.argv[2:]:
        __import__(name)
    chan.sendall(b"R\n")
    msg, fds, _flags, _addr = socket.recv_fds(chan, 16, 1)
    if not msg.startswith(b"C") or len(fds) != 1:
        os._exit(125)
    os.dup2(fds[0], 0)
    os.close(fds[0])
    sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)

    import types

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = [path]
    sys.path[0] = os.path.dirname(path)
    code = 0
    try:
        with open(path, "rb") as fh:
            source = fh.read()
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            code = 130
        # The first frame is this runner's; the traceback starts at the user's file.
        tb = e.__traceback__
        e.__traceback__ = tb.tb_next if tb is not None else None
        sys.excepthook(type(e), e, e.__traceback__)
        code = code or 1
    code = _shutdown(code)
    chan.sendall(b"D %d\n" % (code & 0xFF))
    # pid 1 ends the run now; wait for it.
    while True:
        chan.recv(1) or os._exit(code & 0xFF)


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


def _shutdown(code):
    """What the interpreter does at exit: join non-daemon threads, run atexit handlers, flush."""
    import atexit
    import threading

    try:
        threading._shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    return code


_runcell_main()
