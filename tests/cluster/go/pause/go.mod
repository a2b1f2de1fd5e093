// The pod sandbox's process for the local node's containerd (sandbox_image): no registry is
// reachable, so the project builds its own pause image instead of pulling registry.k8s.io/pause.
module backlog.dev/local-cluster/pause

go 1.26.0
