// The pod sandbox ("pause") program of the local node: no dependencies, built
// with the node's binaries so no image has to be pulled from a registry.
module agentq.dev/controlplane/pause

go 1.26.0
