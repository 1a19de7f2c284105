package enforcer

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuguard/gpuguard/policy"
)

// The runtime follows links on the host in a bind mount's source, and
// admission sees a hostPath only as a name: a root pod that may write a host
// directory plants a link there (/var/tmp/x -> /run/containerd), and a later
// pod, or a later container of the same pod, mounts /var/tmp/x/containerd.sock.
// Only the node sees where the link leads. containerd's CRI resolves each
// hostPath's links when it builds the spec, so the enforcer sees the
// resolved source, not the name: it reads the pod (once per pod, through
// the exemptions' cache) for the names of its hostPath volumes where a
// mount's source lies in a guarded host path, resolves each name as the
// runtime does, and refuses the container where the name leads there
// through a link a pod may have planted. It resolves every bind mount's
// source again too: a link swapped in since containerd resolved it, or a
// source another NRI plugin added, is followed by the runtime as well.
//
// What is judged is the pod's hostPath volumes: the kubelet's own mounts
// (its pod directory: tokens, emptyDirs, /etc/hosts, the termination log)
// and containerd's (the sandbox's hostname, resolv.conf, shm) lie in this
// pod's own state, and the device plugin's, CDI's and other NRI plugins'
// mounts are the node's; none of them is a name a pod chose. A link planted
// inside an emptyDir is followed only where a hostPath names it (the kubelet
// passes an emptyDir's directory itself, and resolves a subPath within its
// volume), and such a name is judged. A name judged to itself, through no
// link, is admission's to judge (sensitive-hostpath, hostpath-link).

// HostPathMount is a mount of one of the pod's hostPath volumes.
type HostPathMount struct {
	// Destination is the mount's path in the container.
	Destination string
	// Name is the host path as the pod names it: the volume's path, joined
	// with the mount's subPath.
	Name     string
	ReadOnly bool
}

// HostPathMountsOf are the mounts of container's hostPath volumes in pod.
// A subPathExpr is expanded by the kubelet from the container's
// environment: its volume's path is judged in its stead.
func HostPathMountsOf(pod *corev1.Pod, container string) []HostPathMount {
	volumes := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			volumes[v.Name] = v.HostPath.Path
		}
	}
	mounts, found := containerMounts(pod, container)
	if !found {
		// An ephemeral container added since the pod was read: it can
		// mount any of the pod's volumes.
		for _, v := range pod.Spec.Volumes {
			mounts = append(mounts, corev1.VolumeMount{Name: v.Name, MountPath: "(volume " + v.Name + ")"})
		}
	}
	var out []HostPathMount
	for _, m := range mounts {
		hostPath, ok := volumes[m.Name]
		if !ok {
			continue
		}
		out = append(out, HostPathMount{Destination: m.MountPath, Name: path.Join("/", hostPath, m.SubPath), ReadOnly: m.ReadOnly})
	}
	return out
}

func containerMounts(pod *corev1.Pod, container string) ([]corev1.VolumeMount, bool) {
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if c.Name == container {
			return c.VolumeMounts, true
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == container {
			return c.VolumeMounts, true
		}
	}
	return nil, false
}

// HostResolver resolves host paths as the kernel will for the runtime,
// inside the host root the agent sees.
type HostResolver struct {
	root string
}

// NewHostResolver resolves paths inside root, itself resolved first: links
// in the root are the agent's own, not the host's.
func NewHostResolver(root string) (*HostResolver, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("host root %q: %w", root, err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, fmt.Errorf("host root %q: %w", root, err)
	}
	return &HostResolver{root: abs}, nil
}

// Resolve follows the links of host path p component by component, as the
// kernel does, never leaving the host root (a link to / or a .. above it
// stays at it), and returns where p leads with the links it followed, both
// as host paths. A component that does not exist is taken as it is: the
// runtime creates a missing hostPath through the same links. Each step is
// one lstat, and one readlink per link; no directory is read. Links are
// followed at most 255 times (securejoin's bound, the kernel's being 40):
// more is a loop, an error, as it is to the runtime.
func (h *HostResolver) Resolve(p string) (resolved string, links []string, err error) {
	vfs := &linkRecorder{root: h.root}
	joined, err := securejoin.SecureJoinVFS(h.root, p, vfs)
	if err != nil {
		return "", nil, err
	}
	return h.hostPath(joined), vfs.links, nil
}

func (h *HostResolver) hostPath(joined string) string {
	rel, err := filepath.Rel(h.root, joined)
	if err != nil || rel == "." {
		return "/"
	}
	return path.Clean("/" + filepath.ToSlash(rel))
}

// linkRecorder is the file system securejoin walks, noting each link it
// reads, as a host path.
type linkRecorder struct {
	root  string
	links []string
}

func (l *linkRecorder) Lstat(name string) (fs.FileInfo, error) { return os.Lstat(name) }

func (l *linkRecorder) Readlink(name string) (string, error) {
	rel, _ := filepath.Rel(l.root, name)
	l.links = append(l.links, path.Clean("/"+filepath.ToSlash(rel)))
	return os.Readlink(name)
}

// decideMountSources refuses a container that would mount, through a link
// a pod may have planted, a host path the policy guards; it asks for the
// pod's hostPath volumes (needsPod) where a mount's source lies in one.
// NRI cannot safely rewrite a mount's source: the container is refused,
// naming the mount, the name and where it leads.
func (r *Rules) decideMountSources(c Container, f Facts) (refuse string, needsPod bool) {
	if r.host == nil {
		return "", false
	}
	for _, m := range c.Mounts {
		if !path.IsAbs(m.Source) {
			continue // proc, tmpfs, sysfs...: no host path
		}
		resolved, links, err := r.host.Resolve(m.Source)
		if err != nil {
			return unresolvable(m.Destination, m.Source, err), false
		}
		if refuse := r.judgeResolved(m.Destination, m.Source, resolved, links, m.ReadOnly); refuse != "" {
			return refuse, false
		}
		if !f.PodRead && r.maybeHostPathVolume(c, m.Source, m.ReadOnly) {
			needsPod = true
		}
	}
	for _, h := range f.HostPaths {
		resolved, links, err := r.host.Resolve(h.Name)
		if err != nil {
			return unresolvable(h.Destination, h.Name, err), false
		}
		if refuse := r.judgeResolved(h.Destination, h.Name, resolved, links, h.ReadOnly); refuse != "" {
			return refuse, false
		}
		if refuse := r.judgeDiverging(c, h, resolved); refuse != "" {
			return refuse, false
		}
	}
	if needsPod {
		return "gpuguard: a mount of the container has its source in a host path the policy guards, and its pod cannot be read " +
			"to tell whether a hostPath volume of it leads there through a planted link; the kubelet retries the creation", true
	}
	return "", false
}

// unresolvable refuses a mount whose source cannot be resolved: a link
// loop, or a component that cannot be read. The runtime would fail a loop
// anyway; anything else leaves unknown where the mount leads, and the
// container is refused rather than mounted unjudged.
func unresolvable(dest, name string, err error) string {
	return fmt.Sprintf("gpuguard: the container's mount %s names the host path %s, which the node cannot resolve (%v): "+
		"where it leads is unknown, and the container is refused rather than mounted unjudged", dest, name, err)
}

// judgeResolved refuses the mount at dest of host path name where it leads
// to resolved, a path the policy guards, through a link a pod may have
// planted; links the host's own system directories hold (/var/run,
// /etc/resolv.conf) are left to admission's judgement of the name.
func (r *Rules) judgeResolved(dest, name, resolved string, links []string, readOnly bool) string {
	if len(links) == 0 || slices.Contains(policy.HostAliases(name), resolved) {
		return ""
	}
	planted := slices.IndexFunc(links, func(l string) bool { return r.engine.PodMayPlantLinkIn(path.Dir(l)) })
	if planted < 0 {
		return ""
	}
	reach := r.engine.ResolvedHostPathReach(resolved, readOnly)
	if reach == "" {
		return ""
	}
	return fmt.Sprintf("gpuguard: the container's mount %s names the host path %s, which the node resolves through the link %s to %s, %s; "+
		"a pod may have planted that link, and NRI cannot change a mount's source: mount the path itself, or exempt the pod's service account",
		dest, name, links[planted], resolved, reach)
}

// judgeDiverging refuses hostPath mount h where the runtime's source for
// it lies in a guarded path that the name, as the enforcer resolved it,
// does not lead to: containerd followed a link the enforcer does not see
// (in a file system mounted on the host since the agent started, which its
// view of the host lacks). A subPath, bound from the pod's own directory,
// is judged by its name alone.
func (r *Rules) judgeDiverging(c Container, h HostPathMount, resolved string) string {
	k := slices.IndexFunc(c.Mounts, func(m Mount) bool { return path.Clean(m.Destination) == path.Clean(h.Destination) })
	if k < 0 {
		return ""
	}
	source := path.Clean(c.Mounts[k].Source)
	if slices.Contains(policy.HostAliases(resolved), source) || !r.maybeHostPathVolume(c, source, h.ReadOnly) || r.isOwnSubPath(c, source) {
		return ""
	}
	return fmt.Sprintf("gpuguard: the container's mount %s names the host path %s, which the runtime resolved to %s, %s, where the node enforcer sees it lead to %s: "+
		"a link the enforcer cannot see leads it there; mount the path itself, or exempt the pod's service account",
		h.Destination, h.Name, source, r.engine.ResolvedHostPathReach(source, h.ReadOnly), resolved)
}

// isOwnSubPath reports whether source is a subPath the kubelet bound in
// the pod's own directory.
func (r *Rules) isOwnSubPath(c Container, source string) bool {
	own := "/pods/" + c.PodUID + "/volume-subpaths/"
	return c.PodUID != "" && strings.Contains(source, own)
}

// maybeHostPathVolume reports whether a mount of source may be one of the
// pod's hostPath volumes leading somewhere the policy guards: a source
// there, outside this pod's own state in the kubelet's and containerd's
// directories, or a subPath the kubelet mounted from this pod's directory
// (a hostPath's subPath is bound from there, whatever it led to). /dev/null,
// the device plugin's device-list mounts, grants nothing.
func (r *Rules) maybeHostPathVolume(c Container, source string, readOnly bool) bool {
	source = path.Clean(source)
	if c.PodUID != "" {
		own := "/pods/" + c.PodUID + "/"
		if i := strings.Index(source+"/", own); i >= 0 {
			return strings.HasPrefix(source[i+len(own):], "volume-subpaths/")
		}
	}
	if c.SandboxID != "" && strings.Contains(source+"/", "/io.containerd.grpc.v1.cri/sandboxes/"+c.SandboxID+"/") {
		return false
	}
	return source != "/dev/null" && r.engine.ResolvedHostPathReach(source, readOnly) != ""
}
