package local

// RunscProcs lists the runsc processes on this host (pid and arguments),
// for the external tests.
func RunscProcs() (pids []int, args [][]string) {
	for _, p := range runscProcesses() {
		pids, args = append(pids, p.pid), append(args, p.args)
	}
	return pids, args
}
