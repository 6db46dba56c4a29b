package runtime

import "fmt"

// Args returns the argv that runs code of lang. The code itself arrives on
// stdin, not in argv: argv is capped at 128 KiB per argument by the kernel,
// and a script in argv would be visible in the process list.
func Args(lang Language) ([]string, error) {
	switch lang {
	case Python:
		// "python3 -" parses the whole of stdin before running it, so the
		// user's code then sees an empty stdin, as it would under a notebook.
		return []string{"/usr/bin/python3", "-"}, nil
	case Shell:
		// bash reading a script from stdin would let `cat` in the script eat
		// the lines after it; read it all first, detach stdin, then run it.
		return []string{"/bin/bash", "-c",
			`IFS= read -r -d '' __airlock_script; exec </dev/null; eval "$__airlock_script"`}, nil
	default:
		return nil, fmt.Errorf("unknown language %q", lang)
	}
}
