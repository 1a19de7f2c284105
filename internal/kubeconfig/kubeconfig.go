// Package kubeconfig finds the API server the way kubectl does, for every
// gpuguard command and the node agent.
package kubeconfig

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Flags are --kubeconfig and --context.
type Flags struct {
	Path, Context string
}

// AddFlags binds --kubeconfig and --context.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Path, "kubeconfig", f.Path, "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the pod's service account in a cluster)")
	fs.StringVar(&f.Context, "context", f.Context, "kubeconfig context to use (default: its current context)")
}

// Load returns the API server configuration as kubectl resolves it: the
// explicit path, else $KUBECONFIG, else ~/.kube/config, else the pod's
// service account in a cluster; Context picks a context other than the
// current one.
func (f Flags) Load() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.Path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.Context}).ClientConfig()
	switch {
	case err == nil:
		return cfg, nil
	case f.Path != "" && clientcmd.IsEmptyConfig(err):
		return nil, fmt.Errorf("--kubeconfig %s: no cluster configured in it", f.Path)
	case f.Path != "":
		return nil, fmt.Errorf("--kubeconfig %s: %v", f.Path, err)
	case clientcmd.IsEmptyConfig(err):
		return nil, errors.New("no cluster configured: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config (in a pod, the service account is used)")
	}
	return nil, fmt.Errorf("loading the kubeconfig: %v", err)
}
