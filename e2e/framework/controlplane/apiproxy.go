package controlplane

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sync"

	"k8s.io/client-go/tools/clientcmd"
)

// APIProxy stands between one client and the API server, forwarding TCP
// (TLS passes through untouched), and can cut that client off: every
// connection through it is closed, and new ones are closed as they come,
// as a network partition between a webhook replica and the API server
// does while the API server can still call the webhook. Resume lets them
// through again.
type APIProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// StartAPIProxy forwards a loopback port to target (host:port).
func StartAPIProxy(target string) (*APIProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &APIProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *APIProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection through the proxy and every new one, until
// Resume.
func (p *APIProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Resume lets connections through again.
func (p *APIProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops the proxy and closes what goes through it.
func (p *APIProxy) Close() error {
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

// Kubeconfig writes a copy of the kubeconfig at path whose every cluster
// is reached through the proxy, and returns the copy's path.
func (p *APIProxy) Kubeconfig(path string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return "", err
	}
	for name, cluster := range cfg.Clusters {
		u, err := url.Parse(cluster.Server)
		if err != nil {
			return "", fmt.Errorf("cluster %s: %w", name, err)
		}
		if u.Host != p.target {
			return "", fmt.Errorf("cluster %s is at %s, not at the proxied %s", name, u.Host, p.target)
		}
		u.Host = p.Addr()
		cluster.Server = u.String()
	}
	out := path + ".proxied"
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		return "", err
	}
	return out, os.Chmod(out, 0o600)
}

func (p *APIProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// track adds c to the connections Cut closes, unless the proxy is cut.
func (p *APIProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *APIProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *APIProxy) forward(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(client)
		return
	}
	if !p.track(server) {
		_ = server.Close()
		p.untrack(client)
		return
	}
	// Either side closing, or Cut, ends both directions.
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(server, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
	<-done
	p.untrack(client, server)
	<-done
}
