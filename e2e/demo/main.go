// Command demo runs gpuguard on a local control plane: etcd and kube-apiserver
// built from pinned sources (make upstream), gpuguard installed with its default
// policy, and the shipped examples applied through the API server. It prints what
// the API server did with each object, then tears everything down. It exits 1
// when an example did not end as its file name says (allowed-, denied-,
// mutated-, warned-): make test runs it.
//
//	make demo            # or: go run ./e2e/demo [-examples DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/gpuguard/gpuguard/config"
	"github.com/gpuguard/gpuguard/e2e/framework/controlplane"
	"github.com/gpuguard/gpuguard/internal/manifest"
	"github.com/gpuguard/gpuguard/internal/warnings"
	"github.com/gpuguard/gpuguard/internal/wellknown"
)

func main() {
	examples := flag.String("examples", "examples", "directory or file of manifests to apply")
	flag.Parse()
	if err := run(*examples); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(examples string) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	docs, errs := manifest.Read([]string{examples}, nil)
	if len(errs) > 0 {
		return errs[0]
	}
	ctx := context.Background()
	fmt.Println("starting etcd and kube-apiserver", "…")
	cp, err := controlplane.StartControlPlane(filepath.Join(root, "_output", "bin"))
	if err != nil {
		return err
	}
	defer cp.Stop()
	fmt.Println("installing gpuguard with the default policy", "…")
	in, err := controlplane.Install(ctx, cp, root, "gpuguard", string(config.DefaultYAML()))
	if err != nil {
		return err
	}
	defer in.Uninstall(ctx, cp)
	for _, d := range docs {
		if err := controlplane.EnsureNamespace(ctx, cp, namespaceOf(d), nil); err != nil {
			return err
		}
	}
	if err := controlplane.WaitEnforcing(ctx, cp.Client, namespaceOf(docs[0]), time.Minute); err != nil {
		return err
	}
	fmt.Printf("applying %s through the API server:\n\n", examples)
	w := &warnings.Collector{}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WarningHandler = w
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// ConfigMaps first: pods may take them through envFrom.
	var wrong []string
	for _, kindFirst := range []bool{true, false} {
		for _, d := range docs {
			if (d.GVK.Kind == "ConfigMap") == kindFirst {
				if msg := expect(d, apply(ctx, dyn, w, d)); msg != "" {
					wrong = append(wrong, msg)
				}
			}
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("%d examples did not end as their file names say:\n  %s", len(wrong), strings.Join(wrong, "\n  "))
	}
	fmt.Println("every example ended as its file name says")
	return nil
}

// outcome is what the API server did with one object.
type outcome struct {
	denied, warned bool
	// voided: gpuguard set void in a container, and annotated the pod so.
	voided bool
}

// expect compares an example's outcome with what its file name promises
// (allowed-, denied-, mutated-, warned-); "" when they agree, and for the
// objects a file needs beside its example (a ConfigMap, a Secret).
func expect(d manifest.Document, got outcome) string {
	if d.GVK.Kind == "ConfigMap" || d.GVK.Kind == "Secret" || d.Object == nil {
		return ""
	}
	name := filepath.Base(d.Source)
	var ok bool
	switch {
	case strings.HasPrefix(name, "allowed-"):
		ok = got == outcome{}
	case strings.HasPrefix(name, "denied-"):
		ok = got.denied
	case strings.HasPrefix(name, "mutated-"):
		ok = !got.denied && got.voided
	case strings.HasPrefix(name, "warned-"):
		ok = !got.denied && got.warned
	default:
		return ""
	}
	if !ok {
		return fmt.Sprintf("%s: %+v", d.Location(), got)
	}
	return ""
}

func apply(ctx context.Context, dyn dynamic.Interface, w *warnings.Collector, d manifest.Document) outcome {
	if d.Object == nil {
		return outcome{}
	}
	u := &unstructured.Unstructured{}
	var err error
	if u.Object, err = runtime.DefaultUnstructuredConverter.ToUnstructured(d.Object); err != nil {
		fmt.Printf("%-8s %s: %v\n", "ERROR", d.Location(), err)
		return outcome{denied: true}
	}
	gvr := schema.GroupVersionResource{Group: d.GVK.Group, Version: d.GVK.Version, Resource: strings.ToLower(d.GVK.Kind) + "s"}
	w.Take()
	created, err := dyn.Resource(gvr).Namespace(namespaceOf(d)).Create(ctx, u, metav1.CreateOptions{})
	what := fmt.Sprintf("%s %s/%s", d.GVK.Kind, namespaceOf(d), d.Meta.Name)
	var o outcome
	switch {
	case err != nil:
		o.denied = true
		fmt.Printf("DENIED   %s\n%s\n", what, indent(err.Error()))
	case d.GVK.Kind == "Pod":
		fmt.Printf("STORED   %s\n", what)
		o.voided = describePod(d.Object.(*corev1.Pod), created)
	default:
		fmt.Printf("STORED   %s\n", what)
	}
	for _, msg := range w.Take() {
		o.warned = true
		fmt.Printf("         warning: %s\n", msg)
	}
	fmt.Println()
	return o
}

// describePod shows each container's effective NVIDIA_VISIBLE_DEVICES as
// stored, whether gpuguard put it there, and the annotation that says so;
// voided is true when gpuguard set void and the annotation names exactly
// the containers it set it in.
func describePod(sent *corev1.Pod, u *unstructured.Unstructured) (voided bool) {
	p := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		return false
	}
	var set []string
	show := func(kind string, stored, original []corev1.Container) {
		for i, c := range stored {
			value, was := visibleDevices(c), visibleDevices(original[i])
			switch {
			case value == "":
				value = "(unset: the device plugin decides)"
			case value != was:
				value += " (set by gpuguard: no GPU limit)"
				set = append(set, c.Name)
			}
			fmt.Printf("         %s %q: NVIDIA_VISIBLE_DEVICES=%s\n", kind, c.Name, value)
		}
	}
	show("init container", p.Spec.InitContainers, sent.Spec.InitContainers)
	show("container", p.Spec.Containers, sent.Spec.Containers)
	annotation, ok := p.Annotations[wellknown.VoidAnnotation]
	if ok {
		fmt.Printf("         annotation %s=%s\n", wellknown.VoidAnnotation, annotation)
	}
	return len(set) > 0 && annotation == strings.Join(set, ",")
}

// visibleDevices is a container's effective NVIDIA_VISIBLE_DEVICES ("" when unset).
func visibleDevices(c corev1.Container) string {
	value := ""
	for _, e := range c.Env {
		if e.Name == "NVIDIA_VISIBLE_DEVICES" {
			value = e.Value
		}
	}
	return value
}

func namespaceOf(d manifest.Document) string {
	if d.Meta.Namespace != "" {
		return d.Meta.Namespace
	}
	return "default"
}

func indent(s string) string {
	return "         " + strings.ReplaceAll(s, "\n", "\n         ")
}
