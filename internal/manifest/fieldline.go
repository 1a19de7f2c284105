package manifest

import (
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// FieldLines parses the document once and returns where its object's
// fields are: the line of the file a field is on, for a path as gpuguard's
// findings give it ("spec.containers[0].env[1]",
// "metadata.annotations[cdi.k8s.io/gpus]"), or where the object starts when
// the path cannot be followed. It is for annotations in reports: a best
// effort, never an error.
func (d *Document) FieldLines() func(path string) int {
	object := d.objectNode()
	return func(path string) int {
		if object == nil {
			return d.Line
		}
		n := object
		for _, step := range pathSteps(path) {
			next := child(n, step)
			if next == nil {
				break
			}
			n = next
		}
		line := n.Line
		if line == 0 {
			line = object.Line
		}
		return d.Line + line - 1
	}
}

// objectNode is the document's object (a List's item for an item), or nil.
func (d *Document) objectNode() *yaml.Node {
	var root yaml.Node
	if d.Line == 0 || yaml.Unmarshal(d.Raw, &root) != nil || len(root.Content) == 0 {
		return nil
	}
	n := root.Content[0]
	if d.Item == 0 {
		return n
	}
	items := child(n, "items")
	if items == nil || items.Kind != yaml.SequenceNode || d.Item > len(items.Content) {
		return nil
	}
	return items.Content[d.Item-1]
}

// pathSteps splits "a.b[0].c[key.with.dots]" into a, b, 0, c, key.with.dots.
func pathSteps(path string) []string {
	var steps []string
	for path != "" {
		switch path[0] {
		case '.':
			path = path[1:]
		case '[':
			end := strings.IndexByte(path, ']')
			if end < 0 {
				return steps
			}
			steps = append(steps, path[1:end])
			path = path[end+1:]
		default:
			end := strings.IndexAny(path, ".[")
			if end < 0 {
				end = len(path)
			}
			steps = append(steps, path[:end])
			path = path[end:]
		}
	}
	return steps
}

// child is a mapping's value under key, or a sequence's element at the
// index key; nil when there is none.
func child(n *yaml.Node, key string) *yaml.Node {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				return n.Content[i+1]
			}
		}
	case yaml.SequenceNode:
		if i, err := strconv.Atoi(key); err == nil && i >= 0 && i < len(n.Content) {
			return n.Content[i]
		}
	}
	return nil
}
