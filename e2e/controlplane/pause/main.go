// Command pause holds a pod's namespaces open until it is told to stop.
//
// It is the sandbox container of every pod on the local node of
// `agentq cluster up --node` (no registry can be pulled from there, so the node
// makes its own image of this static program). As PID 1 of a pod that shares
// its process namespace it also reaps orphaned zombies, like upstream's pause.
//
// Two flags make it useful as a tiny test container too: -say prints a line
// (so `kubectl logs` has something to show) and -version prints and exits (so
// `kubectl exec` has something to run).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "agentq-pause 1"

func main() {
	say := flag.String("say", "", "print this line on start, then pause")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	if *say != "" {
		fmt.Println(*say)
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
			return
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
