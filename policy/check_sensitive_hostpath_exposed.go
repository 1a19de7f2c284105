package policy

// exposedHostPath is the class of sensitive-hostpath for host paths at or
// below a sensitive path (reach), and for parents of one where the policy's
// sensitiveHostPathParents is deny: denied whatever the container, since
// they hold device nodes, plugin sockets or what the runtime runs as root.
func exposedHostPath(in *Input, hp hostPathVolume, reach string) []Finding {
	return in.denyHostPath(hp, "%s exposes %s; use a GPU resource instead", quote(hp.volume.HostPath.Path), reach)
}
