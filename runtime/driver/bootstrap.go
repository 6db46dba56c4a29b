package driver

// CodeDir is where the driver writes the code it is given, inside the
// sandbox: a small tmpfs owned by root, readable by the code, not writable.
const CodeDir = "/.airlock"

// pythonRun runs CodeDir/main.py as __main__ with line-buffered output, in a
// fresh module namespace, and ends like a normal exit but without the slow
// teardown of every module, reporting its status on fd 4 first. Unbuffered output (python -u) loses data under
// gVisor, whose pipes accept partial writes that Python's unbuffered text
// layer does not retry; the buffered layer does. Run from -c, sys.path[0]
// is the working directory, as in a notebook, and the bootstrap's own frame
// is cut from tracebacks so line numbers are the user's.
const pythonRun = `def _airlock_main():
    import builtins, os, sys, types
    # fd 3 is the warm worker's control pipe, already closed there; close
    # the cold placeholder too, so both runs hold the same descriptors. fd 4
    # carries the exit report to the driver; the program's own children do
    # not get it.
    try:
        os.close(3)
    except OSError:
        pass
    try:
        os.set_inheritable(4, False)
    except OSError:
        pass
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    p = "` + CodeDir + `/main.py"
    sys.argv = [p]
    m = types.ModuleType("__main__")
    m.__file__ = p
    m.__builtins__ = builtins
    sys.modules["__main__"] = m
    code = 0
    try:
        with open(p, "rb") as f:
            c = compile(f.read(), p, "exec")
        exec(c, m.__dict__)
    except SystemExit as e:
        code = _airlock_exit_code(e)
    except BaseException as e:
        import traceback
        tb = None if isinstance(e, SyntaxError) else e.__traceback__.tb_next
        traceback.print_exception(type(e), e, tb)
        code = 1
    _airlock_exit(code)

def _airlock_exit_code(e):
    import sys
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    print(c, file=sys.stderr)
    return 1

def _airlock_exit(code):
    # What a normal exit does for the program (wait for its threads, run its
    # atexit functions, flush), without tearing down every module, which
    # takes longer than most programs once numpy and pandas are loaded.
    import atexit, os, sys, threading
    try:
        threading._shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass
    # Everything printed is in the pipes now: the driver reads it all, then
    # reports this status without waiting for the process to be torn down.
    try:
        os.write(4, b"exit %d\n" % code)
    except OSError:
        pass
    os._exit(code)

_airlock_main()
`

// PythonBootstrap is what a cold sandbox runs with python3 -c.
const PythonBootstrap = pythonRun

// pythonWorker is the warm form: it imports the modules named in its
// arguments (numpy and pandas by default), says so on fd 4, and waits on
// fd 3 until the code is in place; then it runs it exactly as
// PythonBootstrap does. fd 3 is closed before the code runs; fd 4 stays for
// the exit report, as in a cold run.
const pythonWorker = `import os as _os
def _airlock_preload():
    import importlib, sys
    for m in sys.argv[1:]:
        importlib.import_module(m)
_airlock_preload()
del _airlock_preload
_os.write(4, b"ready\n")
_go = _os.read(3, 16)
_os.close(3)
if _go != b"go\n":
    raise SystemExit(0)
del _go, _os
` + pythonRun

// Path is where the driver lives in the sandbox image.
const Path = "/usr/lib/airlock/airlock-driver"
