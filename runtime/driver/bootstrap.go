package driver

// CodeDir is where the driver writes the code it is given, inside the
// sandbox: a small tmpfs owned by root, readable by the code, not writable.
const CodeDir = "/.airlock"

// Path is where the driver lives in the sandbox image.
const Path = "/usr/lib/airlock/airlock-driver"

// OutDir is where code leaves files to be returned with its result.
const OutDir = "/workspace/out"

// pythonWorker is every Python run's process, cold or warm, one-shot or a
// session. It imports the modules named in its arguments (none for a cold
// run; numpy and pandas for a warm one by default), says "ready" on fd 4,
// then reads commands from fd 3, one JSON line each:
//
//	{"path": "/.airlock/main.py", "mode": "once"|"session", "caps": {...}, "env": {...}}
//
// sets "env", when there, in os.environ (the run's Work.Env: the worker
// may have started before the run was known), and runs the file like a
// notebook cell: in __main__ (fresh for "once",
// kept across a session's cells), showing the value of a final
// expression, with clean tracebacks whose line numbers are the user's.
// After the cell it reports on fd 4, one JSON line: the exit status, the
// displayed value, and the matplotlib figures shown or left open, as PNG.
// (The driver lists OutDir itself, for shell runs too.) A "once" run then ends like a normal exit (threads joined, atexit
// run, output flushed) but without tearing down every module, which takes
// longer than most programs once numpy and pandas are loaded.
//
// Output is line-buffered: unbuffered output (python -u) loses data under
// gVisor, whose pipes accept partial writes that Python's unbuffered text
// layer does not retry. Run from -c, sys.path[0] is the working directory.
const pythonWorker = `import os as _os
def _airlock_hook_pyplot():
    # plt.show() returns the figures with the result and closes them, as a
    # notebook's inline backend does; Agg alone would only warn.
    import importlib.machinery, sys
    shown = []
    class Hook:
        def find_spec(self, name, path=None, target=None):
            if name != "matplotlib.pyplot":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                def show(*args, **kwargs):
                    shown.extend(_airlock_render(module))
                module.show = show
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Hook())
    return shown
_airlock_shown = _airlock_hook_pyplot()
del _airlock_hook_pyplot

def _airlock_preload():
    import gc, importlib, sys
    for m in sys.argv[1:]:
        importlib.import_module(m)
    if sys.argv[1:]:
        # The preloaded modules' objects live as long as the worker: kept
        # out of the collector, a cell never pays for a full collection
        # over them (16 ms with numpy and pandas under gVisor).
        gc.collect()
        gc.freeze()
_airlock_preload()
del _airlock_preload

def _airlock_serve():
    import builtins, json, os, sys, types
    # What every cell uses, imported before "ready": a warm cell must not
    # pay for finding and loading them (through the gofer) on its path.
    import ast, atexit, base64, threading, traceback
    # The control and report pipes are the driver's: the program's own
    # children do not get them.
    for fd in (3, 4):
        os.set_inheritable(fd, False)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    os.write(4, b"ready\n")
    # Buffered: an unbuffered readline reads one byte per syscall, and
    # each syscall is a trip through the sentry. The driver sends the next
    # command only after this one's report, so nothing is read ahead of
    # its time, and what is read stays in this one reader.
    ctl = os.fdopen(3, "rb")
    main = None
    while True:
        try:
            line = ctl.readline()
        except KeyboardInterrupt:
            continue  # an interrupt that came between cells
        if not line:
            os._exit(0)
        cmd = json.loads(line)
        if "restored" in cmd:
            # Restored from a checkpoint other sandboxes are restored from
            # too: without this, every clone draws the same numbers.
            for n in ("random", "numpy.random"):
                if n in sys.modules:
                    sys.modules[n].seed()
            if cmd.get("touch"):
                _airlock_touch()
            continue
        once = cmd.get("mode") == "once"
        # The driver killed whatever the last cell started; collect the
        # ones that were this process's children, so they do not count
        # against the process limit. Before the first cell there are none,
        # and every system call on a warm run's path costs (see below).
        if main is not None:
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
        if main is None or once:
            main = types.ModuleType("__main__")
            main.__builtins__ = builtins
            sys.modules["__main__"] = main
        env = cmd.get("env")
        if env:
            # Through os.environ, so putenv passes it to subprocesses too.
            os.environ.update(env)
        main.__file__ = cmd["path"]
        sys.argv = [cmd["path"]]
        rep = _airlock_cell(cmd["path"], main.__dict__, cmd.get("caps") or {})
        # Figures first: matplotlib closes them all at exit.
        rep.update(_airlock_extras(cmd.get("caps") or {}))
        if once:
            _airlock_finish()
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        # Everything printed is in the pipes now: the driver reads it all,
        # then reports, without waiting for this process to end.
        os.write(4, (json.dumps(rep) + "\n").encode())
        if once:
            os._exit(rep["exit"])

def _airlock_touch():
    # A restored sandbox maps its memory back in at each page's first
    # touch. Touch what a cell uses now, while the sandbox waits, not on
    # the first cell's path: every object of the heap, and a cell's code.
    import ast, gc, json
    gc.unfreeze()
    for o in gc.get_objects():
        type(o)
    gc.freeze()
    ns = {}
    tree = ast.parse("x = 1\nx", "<touch>")
    last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<touch>", "exec"), ns)
    repr(eval(compile(last, "<touch>", "eval"), ns))
    json.dumps({"exit": 0, "display": "1"})

def _airlock_cell(path, ns, caps):
    import ast, sys, traceback
    rep = {"exit": 0}
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, path, "exec"), ns)
        if last is not None:
            value = eval(compile(last, path, "eval"), ns)
            if value is not None:
                rep["display"] = _airlock_show(value, caps.get("display_bytes", 65536))
    except SystemExit as e:
        rep["exit"] = _airlock_exit_code(e)
    except BaseException as e:
        tb = None if isinstance(e, SyntaxError) else e.__traceback__.tb_next
        traceback.print_exception(type(e), e, tb)
        rep["exit"] = 1
        if isinstance(e, KeyboardInterrupt):
            rep["interrupted"] = True
    return rep

def _airlock_exit_code(e):
    import sys
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    print(c, file=sys.stderr)
    return 1

def _airlock_show(v, cap):
    import sys
    try:
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(v, (pd.DataFrame, pd.Series)):
            s = v.to_string(max_rows=60, max_cols=20)
        else:
            s = repr(v)
    except Exception as e:
        s = "<value could not be shown: %r>" % e
    if len(s) > cap:
        s = s[:cap] + "\n[airlock: display truncated at %d characters]" % cap
    return s

def _airlock_finish():
    # What interpreter exit does, when there is something to do: under
    # gVisor a system call on an idle sandbox costs up to a few hundred
    # microseconds, and a print(1) makes none of these need one.
    import atexit, threading
    try:
        if threading.active_count() > 1:
            threading._shutdown()
    except BaseException:
        pass
    try:
        if atexit._ncallbacks():
            atexit._run_exitfuncs()
    except BaseException:
        pass

def _airlock_render(plt):
    # Every open figure as PNG bytes (or the error), then closed.
    import io
    out = []
    for n in plt.get_fignums():
        try:
            buf = io.BytesIO()
            plt.figure(n).savefig(buf, format="png", dpi=100, bbox_inches="tight")
            out.append(buf.getvalue())
        except Exception as e:
            out.append(e)
    plt.close("all")
    return out

def _airlock_extras(caps):
    import base64, sys
    out = {}
    figures = list(_airlock_shown)
    del _airlock_shown[:]
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            figures.extend(_airlock_render(plt))
        except Exception as e:
            figures.append(e)
    images, skipped = [], 0
    for data in figures:
        if isinstance(data, Exception):
            out["figure_error"] = repr(data)
        elif len(images) < caps.get("max_images", 4) and len(data) <= caps.get("image_bytes", 1 << 20):
            images.append(base64.b64encode(data).decode())
        else:
            skipped += 1
    if images:
        out["images"] = images
    if skipped:
        out["images_skipped"] = skipped
    return out

_airlock_serve()
`
