// Package manifest reads Kubernetes objects from files, directories and standard
// input, the way `gpuguard check` takes them: YAML (several documents per file), JSON,
// and kind: List.
package manifest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// Stdin is the path that stands for standard input.
const Stdin = "-"

// Document is one object read from an input.
type Document struct {
	// Source is the file it came from ("<stdin>" for standard input).
	Source string
	// Index is the document's 1-based position in its file; Item is its 1-based
	// position in a kind: List, or 0.
	Index, Item int
	GVK         schema.GroupVersionKind
	// Object is the decoded object, or nil for a kind gpuguard does not know.
	Object runtime.Object
	// Meta holds the object's name, namespace and labels, whatever its kind.
	Meta metav1.ObjectMeta
}

// Location names the document for messages: file#index or file#index.item.
func (d *Document) Location() string {
	if d.Item > 0 {
		return fmt.Sprintf("%s#%d.%d", d.Source, d.Index, d.Item)
	}
	return fmt.Sprintf("%s#%d", d.Source, d.Index)
}

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
}

// Read reads every path: a file, a directory (walked for *.yaml, *.yml and *.json)
// or Stdin. It returns the documents it could read and one error per input that it
// could not, naming the file and the document.
func Read(paths []string, stdin io.Reader) ([]Document, []error) {
	var docs []Document
	var errs []error
	add := func(d []Document, err error) {
		docs = append(docs, d...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range paths {
		if p == Stdin {
			add(readStream("<stdin>", stdin))
			continue
		}
		files, err := expand(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range files {
			add(readFile(f))
		}
	}
	return docs, errs
}

// expand turns a path into the files it names.
func expand(p string) ([]string, error) {
	info, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{p}, nil
	}
	var files []string
	err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yaml", ".yml", ".json":
			if !d.IsDir() {
				files = append(files, path)
			}
		}
		return nil
	})
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("%s: no *.yaml, *.yml or *.json files in this directory", p)
	}
	return files, err
}

func readFile(name string) ([]Document, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readStream(name, f)
}

// readStream reads the documents of one YAML or JSON stream. It stops at the first
// document that does not parse.
func readStream(source string, r io.Reader) ([]Document, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs []Document
	for index := 1; ; index++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, fmt.Errorf("%s: document %d: %w", source, index, err)
		}
		d, err := decode(source, index, raw)
		if err != nil {
			return docs, err
		}
		docs = append(docs, d...)
	}
}

// decode decodes one document, expanding a List into its items.
func decode(source string, index int, raw []byte) ([]Document, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: document %d: %s", source, index, fmt.Sprintf(format, args...))
	}
	data, err := sigsyaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fail("%v", err)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || bytes.Equal(data, []byte("null")) {
		return nil, nil // an empty document, such as a trailing ---
	}
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Items           []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fail("not a Kubernetes object: %v", err)
	}
	if head.APIVersion == "" || head.Kind == "" {
		return nil, fail("not a Kubernetes object: apiVersion and kind are required")
	}
	if head.Kind != "List" && !strings.HasSuffix(head.Kind, "List") {
		d, err := decodeObject(data)
		if err != nil {
			return nil, fail("%v", err)
		}
		d.Source, d.Index = source, index
		return []Document{d}, nil
	}
	docs := make([]Document, 0, len(head.Items))
	for i, item := range head.Items {
		d, err := decodeObject(item)
		if err != nil {
			return nil, fail("item %d: %v", i+1, err)
		}
		d.Source, d.Index, d.Item = source, index, i+1
		docs = append(docs, d)
	}
	return docs, nil
}

// DecodeObject decodes one JSON or YAML object of a kind gpuguard knows (core, apps
// and batch API groups) into its typed form.
func DecodeObject(data []byte) (runtime.Object, error) {
	data, err := sigsyaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	d, err := decodeObject(data)
	if err == nil && d.Object == nil {
		err = fmt.Errorf("kind %s is not one gpuguard knows", d.GVK)
	}
	return d.Object, err
}

// DecodeAs decodes a JSON object of the given kind, as an admission request carries
// it. It returns nil, without an error, for a kind gpuguard does not know.
func DecodeAs(gvk schema.GroupVersionKind, data []byte) (runtime.Object, error) {
	if !scheme.Recognizes(gvk) {
		return nil, nil
	}
	obj, _, err := codecs.UniversalDeserializer().Decode(data, &gvk, nil)
	return obj, err
}

// decodeObject decodes a JSON object into its typed form where the kind is known.
func decodeObject(data []byte) (Document, error) {
	var partial metav1.PartialObjectMetadata
	if err := json.Unmarshal(data, &partial); err != nil {
		return Document{}, fmt.Errorf("not a Kubernetes object: %v", err)
	}
	gvk := partial.GroupVersionKind()
	if gvk.Kind == "" || partial.APIVersion == "" {
		return Document{}, errors.New("not a Kubernetes object: apiVersion and kind are required")
	}
	d := Document{GVK: gvk, Meta: partial.ObjectMeta}
	if !scheme.Recognizes(gvk) {
		return d, nil
	}
	obj, _, err := codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return Document{}, fmt.Errorf("%s %q: %v", gvk.Kind, partial.Name, err)
	}
	d.Object = obj
	return d, nil
}
