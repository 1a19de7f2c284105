package release

import (
	"archive/tar"
	"bytes"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file system object of a layer.
type entry struct {
	kind     byte // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode     int64
	uid, gid int
	data     []byte
	target   string // a symlink's
}

// tree is the content of one layer, by absolute path.
type tree map[string]entry

// dir adds a directory, and its parents as root-owned 0755 directories.
func (t tree) dir(p string, mode int64, uid, gid int) {
	t.parents(p)
	t[p] = entry{kind: tar.TypeDir, mode: mode, uid: uid, gid: gid}
}

// file adds a root-owned regular file.
func (t tree) file(p string, mode int64, data []byte) {
	t.parents(p)
	t[p] = entry{kind: tar.TypeReg, mode: mode, data: data}
}

// symlink adds a symbolic link to target.
func (t tree) symlink(p, target string) {
	t.parents(p)
	t[p] = entry{kind: tar.TypeSymlink, mode: 0o777, target: target}
}

func (t tree) parents(p string) {
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if _, ok := t[d]; !ok {
			t[d] = entry{kind: tar.TypeDir, mode: 0o755}
		}
	}
}

// layer archives the tree in path order, every entry dated epoch, as a
// gzip-compressed OCI layer. Same tree and epoch, same digest.
func (t tree) layer(epoch time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(maps.Keys(t)) {
		e := t[p]
		name := strings.TrimPrefix(p, "/")
		if e.kind == tar.TypeDir {
			name += "/"
		}
		hdr := &tar.Header{
			Typeflag: e.kind, Name: name, Linkname: e.target, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, Size: int64(len(e.data)), ModTime: epoch, Format: tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer))
}
