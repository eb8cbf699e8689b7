"""runcell's matplotlib backend: Agg, plus every figure that is shown comes back as a PNG.

Selected with ``MPLBACKEND=module://runcell_plots``. It renders exactly like Agg
(``FigureCanvas`` is ``FigureCanvasAgg``; ``savefig`` works as usual). ``plt.show()`` saves
every open figure to ``$RUNCELL_FIGURES_DIR/figure-<n>.png`` (default ``/workspace/figures``),
n counting up across the run, and closes them; figures still open when the interpreter exits
are saved the same way, so a program that never calls ``show()`` or ``savefig()`` still
returns its plots. Nothing here runs unless the program imports matplotlib.
"""

import atexit
import os
import sys

from matplotlib import _pylab_helpers
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase

DEFAULT_FIGURES_DIR = "/workspace/figures"

# The last figure number handed out by this process. Names are claimed with O_EXCL, so a
# figure the program saved itself under the same name, or another process of the same run
# using this backend, is never overwritten: the number just moves on.
_last = 0


def figures_dir():
    return os.environ.get("RUNCELL_FIGURES_DIR") or DEFAULT_FIGURES_DIR


def _warn(message):
    try:
        print(f"runcell_plots: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


def _claim(directory):
    """Create the next free figure-<n>.png exclusively; return (path, open file)."""
    global _last
    while True:
        _last += 1
        path = os.path.join(directory, f"figure-{_last}.png")
        try:
            return path, open(path, "xb")
        except FileExistsError:
            continue


def _save(figure):
    directory = figures_dir()
    try:
        os.makedirs(directory, exist_ok=True)
        path, fh = _claim(directory)
    except OSError as e:
        _warn(f"cannot save a figure to {directory}: {e}")
        return None
    try:
        with fh:
            # The figure's own size and dpi (matplotlib's defaults unless it set them).
            figure.savefig(fh, format="png")
    except Exception as e:
        _warn(f"cannot save {path}: {type(e).__name__}: {e}")
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    return path


def save_all():
    """Save every open pyplot figure, in figure-number order, then close them.

    Returns the paths written.
    """
    managers = sorted(
        _pylab_helpers.Gcf.get_all_fig_managers(),
        key=lambda m: (0, m.num, "") if isinstance(m.num, int) else (1, 0, str(m.num)),
    )
    written = []
    for manager in managers:
        path = _save(manager.canvas.figure)
        if path is not None:
            written.append(path)
    _pylab_helpers.Gcf.destroy_all()
    return written


def show(*args, block=None, **kwargs):
    """pyplot.show(): save the open figures as PNG files and close them (never blocks)."""
    save_all()


def _at_exit():
    try:
        if _pylab_helpers.Gcf.get_all_fig_managers():
            save_all()
    except Exception as e:  # never turn a finished program into a traceback
        _warn(f"saving figures at exit failed: {type(e).__name__}: {e}")


atexit.register(_at_exit)
