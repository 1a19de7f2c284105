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
	"regexp"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// Stdin is the path that stands for standard input.
const Stdin = "-"

// StdinName is the Source of documents read from standard input.
const StdinName = "<stdin>"

// Document is one object read from an input.
type Document struct {
	// Source is the file it came from ("<stdin>" for standard input).
	Source string
	// Index is the document's 1-based position in its file; Item is its 1-based
	// position in a kind: List, or 0.
	Index, Item int
	// Line is the line of the file the document starts on, 1-based.
	Line int
	// Raw is the document as read (for a List item, the whole List).
	Raw []byte
	GVK schema.GroupVersionKind
	// Object is the decoded object, or nil for a kind gpuguard does not know
	// and for a document that is not a Kubernetes object at all.
	Object runtime.Object
	// Meta holds the object's name, namespace and labels, whatever its kind.
	Meta metav1.ObjectMeta
	// NotObject says why a document that parsed is no Kubernetes object
	// (a kustomization without apiVersion, a CI workflow): it is skipped.
	NotObject string
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
	// strict is the decoder of files under check: an unknown or duplicate
	// field in a kind the API server knows is an error there too (kubectl's
	// default field validation), so a typo such as envv: is not judged as
	// if it were absent.
	strict = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
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
			add(readStream(StdinName, stdin))
			continue
		}
		inputs, err := expand(p)
		if err != nil {
			errs = append(errs, err)
		}
		for _, in := range inputs {
			if in.kustomization {
				add(readKustomization(in.path))
			} else {
				add(readFile(in.path))
			}
		}
	}
	return docs, errs
}

// input is a file to read, or a kustomization directory to render.
type input struct {
	path          string
	kustomization bool
}

// kustomizationFiles are the names kustomize reads a directory's
// kustomization from.
var kustomizationFiles = []string{"kustomization.yaml", "kustomization.yml", "Kustomization"}

func isKustomization(dir string) bool {
	for _, name := range kustomizationFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

// readKustomization renders a kustomization directory with the kustomize
// API, as kubectl kustomize does, and reads what it builds: the objects as
// the cluster would get them, never its patches one by one.
func readKustomization(dir string) ([]Document, error) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("%s: kustomize build: %w", dir, err)
	}
	out, err := resources.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("%s: kustomize build: %w", dir, err)
	}
	return readStream(dir+" (kustomize build)", bytes.NewReader(out))
}

// expand turns a path into what it names: a file; a directory's files;
// a kustomization directory, rendered as one input, its own files (patches,
// bases below it) not read one by one. A Helm chart is refused with how to
// render it: its templates are not manifests.
func expand(p string) ([]input, error) {
	info, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []input{{path: p}}, nil
	}
	var inputs []input
	var charts []error
	err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if _, err := os.Stat(filepath.Join(path, "Chart.yaml")); err == nil {
				charts = append(charts, fmt.Errorf("%s is a Helm chart, whose templates are not manifests: render it first, e.g. helm template RELEASE %s -n NAMESPACE | gpuguard check -", path, path))
				return filepath.SkipDir
			}
			if isKustomization(path) {
				inputs = append(inputs, input{path: path, kustomization: true})
				return filepath.SkipDir
			}
			return nil
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yaml", ".yml", ".json":
			inputs = append(inputs, input{path: path})
		}
		return nil
	})
	if err == nil && len(inputs) == 0 && len(charts) == 0 {
		err = fmt.Errorf("%s: no *.yaml, *.yml or *.json files in this directory", p)
	}
	return inputs, errors.Join(append(charts, err)...)
}

func readFile(name string) ([]Document, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readStream(name, f)
}

// readStream reads the documents of one YAML or JSON stream. A document
// that does not parse is an error naming its file line; the others are read.
func readStream(source string, r io.Reader) ([]Document, error) {
	var docs []Document
	var errs []error
	err := splitDocuments(r, func(index, line int, raw []byte) {
		d, err := decode(source, index, line, raw)
		docs = append(docs, d...)
		if err != nil {
			errs = append(errs, err)
		}
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", source, err))
	}
	return docs, errors.Join(errs...)
}

// splitDocuments calls each with every document of a YAML stream, its
// 1-based index and the file line it starts on. A document ends at a line
// "---" (possibly followed by a comment), as for the API machinery's YAML
// reader.
func splitDocuments(r io.Reader, each func(index, line int, raw []byte)) error {
	br := bufio.NewReader(r)
	var doc bytes.Buffer
	index, start, line := 1, 1, 0
	for {
		text, err := br.ReadBytes('\n')
		if len(text) > 0 {
			line++
			if isSeparator(text) {
				each(index, start, bytes.Clone(doc.Bytes()))
				doc.Reset()
				index, start = index+1, line+1
			} else {
				doc.Write(text)
			}
		}
		if errors.Is(err, io.EOF) {
			each(index, start, bytes.Clone(doc.Bytes()))
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func isSeparator(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("---"))
	if !ok {
		return false
	}
	rest = bytes.TrimSpace(rest)
	return len(rest) == 0 || rest[0] == '#'
}

// yamlLine is the line number in a YAML error, which counts from the
// document's start.
var yamlLine = regexp.MustCompile(`\bline (\d+)\b`)

// atFileLine rewrites the document-relative line numbers of a YAML error
// into lines of the file.
func atFileLine(err error, start int) string {
	return yamlLine.ReplaceAllStringFunc(err.Error(), func(m string) string {
		n, _ := strconv.Atoi(yamlLine.FindStringSubmatch(m)[1])
		return "line " + strconv.Itoa(start+n-1)
	})
}

// decode decodes one document, expanding a List into its items. An empty
// document is nothing; one that is not a Kubernetes object is returned with
// NotObject set.
func decode(source string, index, line int, raw []byte) ([]Document, error) {
	fail := func(format string, args ...any) error {
		return &DocumentError{Source: source, Line: line, Index: index, Problem: fmt.Sprintf(format, args...)}
	}
	// Duplicate keys are an error in a Kubernetes object, as for the API
	// server, but not a reason to stop at a document that is none.
	data, dupErr := sigsyaml.YAMLToJSONStrict(raw)
	if dupErr != nil {
		var err error
		if data, err = sigsyaml.YAMLToJSON(raw); err != nil {
			return nil, fail("%s", atFileLine(err, line))
		}
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || bytes.Equal(data, []byte("null")) {
		return nil, nil // an empty document, such as a trailing ---
	}
	at := Document{Source: source, Index: index, Line: line, Raw: raw}
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Items           []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &head); err != nil || head.APIVersion == "" || head.Kind == "" {
		at.NotObject = "not a Kubernetes object (no apiVersion and kind)"
		return []Document{at}, nil
	}
	if dupErr != nil {
		return nil, fail("%s", atFileLine(dupErr, line))
	}
	if head.Kind != "List" && !strings.HasSuffix(head.Kind, "List") {
		d, err := decodeObject(data, strict)
		if err != nil {
			return nil, fail("%v", err)
		}
		d.Source, d.Index, d.Line, d.Raw = source, index, line, raw
		return []Document{d}, nil
	}
	docs := make([]Document, 0, len(head.Items))
	var errs []error
	for i, item := range head.Items {
		d, err := decodeObject(item, strict)
		if err != nil {
			errs = append(errs, fail("item %d: %v", i+1, err))
			continue
		}
		d.Source, d.Index, d.Item, d.Line, d.Raw = source, index, i+1, line, raw
		docs = append(docs, d)
	}
	return docs, errors.Join(errs...)
}

// DecodeObject decodes one JSON or YAML object of a kind gpuguard knows (core, apps
// and batch API groups) into its typed form.
func DecodeObject(data []byte) (runtime.Object, error) {
	data, err := sigsyaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	d, err := decodeObject(data, codecs.UniversalDeserializer())
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
func decodeObject(data []byte, decoder runtime.Decoder) (Document, error) {
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
	obj, _, err := decoder.Decode(data, nil, nil)
	if err != nil {
		return Document{}, fmt.Errorf("%s %q: %v", gvk.Kind, partial.Name, err)
	}
	d.Object = obj
	return d, nil
}

// DocumentError is a document of an input that cannot be judged: where it
// starts, and what is wrong with it.
type DocumentError struct {
	Source  string
	Line    int
	Index   int
	Problem string
}

func (e *DocumentError) Error() string {
	return fmt.Sprintf("%s:%d: document %d: %s", e.Source, e.Line, e.Index, e.Problem)
}
