package runtime

import "fmt"

// CodeDir is where a run's code is placed inside the sandbox: a directory in
// the run's own (read-only mounted) root layer, owned by root.
const CodeDir = "/.airlock"

// pythonBootstrap runs the user's file as __main__ with line-buffered
// output. Unbuffered output (python -u) loses data under gVisor, whose pipes
// accept partial writes that Python's unbuffered text layer does not retry;
// the buffered layer does. Run from -c, sys.path[0] is the working
// directory, as in a notebook, and the bootstrap's own frame is cut from
// tracebacks so line numbers are the user's.
const pythonBootstrap = `import sys
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)
p = "` + CodeDir + `/main.py"
sys.argv = [p]
import __main__
g = __main__.__dict__
g["__file__"] = p
del p
try:
    with open(g["__file__"], "rb") as f:
        c = compile(f.read(), g["__file__"], "exec")
    exec(c, g)
except SystemExit:
    raise
except BaseException as e:
    import traceback
    tb = None if isinstance(e, SyntaxError) else e.__traceback__.tb_next
    traceback.print_exception(type(e), e, tb)
    sys.exit(1)
`

// CodeFile is the path of a run's code inside the sandbox.
func CodeFile(lang Language) (string, error) {
	switch lang {
	case Python:
		return CodeDir + "/main.py", nil
	case Shell:
		return CodeDir + "/main.sh", nil
	default:
		return "", fmt.Errorf("unknown language %q", lang)
	}
}

// Args returns the argv that runs the code file of lang. The code is never
// in argv: argv is capped at 128 KiB per argument and shows in ps.
func Args(lang Language) ([]string, error) {
	switch lang {
	case Python:
		return []string{"/usr/bin/python3", "-c", pythonBootstrap}, nil
	case Shell:
		return []string{"/bin/bash", CodeDir + "/main.sh"}, nil
	default:
		return nil, fmt.Errorf("unknown language %q", lang)
	}
}
