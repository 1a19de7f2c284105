// Package servingcert keeps the webhook's serving certificate when gpuguard
// manages it: cert-controller issues and rotates it in a Secret and injects
// the CA bundle into the webhook configurations, and DirWriter copies the
// Secret into the certificate directory without waiting for the kubelet.
package servingcert

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Options name the Secret, the files and the webhook configurations.
type Options struct {
	// Secret holds the CA and the serving certificate.
	Secret types.NamespacedName
	// Dir, CertName and KeyName are where the webhook server reads them.
	Dir, CertName, KeyName string
	// ServiceName is the webhook's Service, in Secret's namespace.
	ServiceName   string
	ExtraDNSNames []string
	// MutatingConfig and ValidatingConfig get the CA bundle ("" for none).
	MutatingConfig, ValidatingConfig string
	// WriteDir writes the Secret into Dir as soon as it changes (Dir must be
	// writable), instead of waiting for the kubelet to refresh a mount.
	WriteDir bool
}

// Add has cert-controller keep a CA and a serving certificate in o.Secret,
// written to o.Dir (by DirWriter too, with o.WriteDir), with the CA bundle
// injected into the webhook configurations; serve is added once the first
// certificate is there.
func Add(mgr manager.Manager, o Options, serve manager.Runnable, log logr.Logger) error {
	if o.WriteDir {
		client, err := kubernetes.NewForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		if err := mgr.Add(NewDirWriter(client, o, log.WithName("cert-dir"))); err != nil {
			return err
		}
	}
	ready := make(chan struct{})
	var webhooks []rotator.WebhookInfo
	if o.MutatingConfig != "" {
		webhooks = append(webhooks, rotator.WebhookInfo{Name: o.MutatingConfig, Type: rotator.Mutating})
	}
	if o.ValidatingConfig != "" {
		webhooks = append(webhooks, rotator.WebhookInfo{Name: o.ValidatingConfig, Type: rotator.Validating})
	}
	err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      o.Secret,
		CertDir:        o.Dir,
		CertName:       o.CertName,
		KeyName:        o.KeyName,
		CAName:         "gpuguard-ca",
		CAOrganization: "gpuguard",
		DNSName:        fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Secret.Namespace),
		ExtraDNSNames:  o.ExtraDNSNames,
		IsReady:        ready,
		Webhooks:       webhooks,
	})
	if err != nil {
		return fmt.Errorf("setting up certificate rotation: %w", err)
	}
	// A runnable added after the manager started is started at once.
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-ready:
			return mgr.Add(serve)
		case <-ctx.Done():
			return nil
		}
	}))
}

// Follow writes o.Secret into o.Dir as it changes (another process, the
// webhook's controller, issues and rotates it), and adds serve once the
// first certificate is written: a serving pod that needs no grant to write
// the Secret or the webhook configurations.
func Follow(mgr manager.Manager, o Options, serve manager.Runnable, log logr.Logger) error {
	client, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	w := NewDirWriter(client, o, log.WithName("cert-dir"))
	if err := mgr.Add(w); err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-w.Written():
			return mgr.Add(serve)
		case <-ctx.Done():
			return nil
		}
	}))
}
