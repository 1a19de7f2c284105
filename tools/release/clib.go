package release

import (
	"debug/elf"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
)

// debPackage is a Debian package whose files an image carries.
type debPackage struct {
	Name, Version, Arch, Source string
	// Distro is the os-release ID of the machine it came from (debian).
	Distro string
	// Status is its dpkg status stanza, which the image keeps under
	// /var/lib/dpkg/status.d/ (as distroless images do) so that scanners see it.
	Status []byte
}

// addCLibrary puts into t the shared libraries bin loads, its dynamic
// loader first, and whatever those load, from this machine's Debian
// packages: the platform's own for the machine's architecture, the
// cross-compilation package (libc6-arm64-cross, say) for another. They go
// where Debian puts them, /lib/TRIPLE/, with the loader also at the path the
// binary names. It returns the packages they came from.
func addCLibrary(t tree, bin string, p Platform) ([]debPackage, error) {
	triple := crossTriple(p.Arch)
	dirs := []string{"/lib/" + triple, "/usr/lib/" + triple}
	if p != HostPlatform() {
		dirs = []string{"/usr/" + triple + "/lib"}
	}
	interp, needed, err := elfDeps(bin)
	if err != nil {
		return nil, err
	}
	if interp == "" {
		return nil, fmt.Errorf("%s is not dynamically linked; a cgo build should be", bin)
	}
	owners := map[string]bool{}
	queue := append([]string{path.Base(interp)}, needed...)
	for seen := map[string]bool{}; len(queue) > 0; queue = queue[1:] {
		lib := queue[0]
		if seen[lib] {
			continue
		}
		seen[lib] = true
		found, err := findLibrary(lib, dirs)
		if err != nil {
			return nil, fmt.Errorf("%s for %s: %w", lib, p, err)
		}
		data, err := os.ReadFile(found)
		if err != nil {
			return nil, err
		}
		t.file("/lib/"+triple+"/"+lib, 0o755, data)
		_, more, err := elfDeps(found)
		if err != nil {
			return nil, err
		}
		queue = append(queue, more...)
		owner, err := dpkgOwner(found)
		if err != nil {
			return nil, err
		}
		owners[owner] = true
	}
	if target := "/lib/" + triple + "/" + path.Base(interp); interp != target {
		t.symlink(interp, target)
	}
	var pkgs []debPackage
	for _, name := range slices.Sorted(maps.Keys(owners)) {
		pkg, err := dpkgPackage(name)
		if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, pkg)
		t.file("/var/lib/dpkg/status.d/"+pkg.Name, 0o644, pkg.Status)
	}
	return pkgs, nil
}

// elfDeps reads an ELF file's interpreter and the libraries it needs.
func elfDeps(file string) (interp string, needed []string, err error) {
	f, err := elf.Open(file)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			raw := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(raw, 0); err != nil {
				return "", nil, fmt.Errorf("%s: reading its interpreter: %w", file, err)
			}
			interp = strings.TrimRight(string(raw), "\x00")
		}
	}
	needed, err = f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return "", nil, fmt.Errorf("%s: %w", file, err)
	}
	return interp, needed, nil
}

func findLibrary(lib string, dirs []string) (string, error) {
	for _, d := range dirs {
		p := d + "/" + lib
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(dirs, ", "))
}

// dpkgOwner names the Debian package that installed file.
func dpkgOwner(file string) (string, error) {
	out, err := exec.Command("dpkg-query", "-S", file).Output()
	if err != nil {
		return "", fmt.Errorf("the C library comes from Debian packages, and dpkg-query finds none holding %s: %w", file, err)
	}
	owner, _, ok := strings.Cut(strings.TrimSpace(string(out)), ": ")
	if !ok || strings.Contains(owner, ",") {
		return "", fmt.Errorf("dpkg-query -S %s: unexpected answer %q", file, out)
	}
	return owner, nil
}

// dpkgPackage reads an installed package's version and status stanza.
func dpkgPackage(name string) (debPackage, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}\t${source:Package}", name).Output()
	if err != nil {
		return debPackage{}, fmt.Errorf("dpkg-query -W %s: %w", name, err)
	}
	fields := strings.Split(string(out), "\t")
	if len(fields) != 4 {
		return debPackage{}, fmt.Errorf("dpkg-query -W %s: unexpected answer %q", name, out)
	}
	status, err := exec.Command("dpkg-query", "-s", name).Output()
	if err != nil {
		return debPackage{}, fmt.Errorf("dpkg-query -s %s: %w", name, err)
	}
	return debPackage{Name: fields[0], Version: fields[1], Arch: fields[2], Source: fields[3], Status: status}, nil
}
