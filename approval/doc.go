// Package approval decides whether a run needs a human, shows that human
// exactly what will run, binds the human's answer to that one request, and
// records the outcome.
//
// It sits between tools/ and runtime/ and imports neither MCP nor any
// transport code, so the same gate serves every transport and can be tested
// as a plain library.
package approval
