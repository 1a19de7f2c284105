package webhook

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuguard/gpuguard/internal/manifest"
)

// stalledHeaders opens a TLS connection to s and sends a request line and
// pad bytes of a header that never ends, as a client that holds the
// connection's header buffer would.
func stalledHeaders(t testing.TB, s *server, pad int) *tls.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", strings.TrimPrefix(s.base, "https://"), &tls.Config{RootCAs: s.pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: gpuguard\r\nX-Pad: %s", ValidatePath, strings.Repeat("a", pad)); err != nil {
		t.Fatal(err)
	}
	return c
}

// statusLine reads c's first response line, waiting up to d.
func statusLine(c net.Conn, d time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	return bufio.NewReader(c).ReadString('\n')
}

// TestStalledHeadersDoNotStopReviews: a few hundred connections that send
// part of their headers and stall hold at most MaxHeaderBytes each, and
// reviews beside them are answered; headers over the limit are refused
// with 431. Before the server was gpuguard's own, each connection could
// hold 1 MiB of headers for 32 s: 150 of them took the webhook past the
// chart's 256 MiB.
func TestStalledHeadersDoNotStopReviews(t *testing.T) {
	const stalled = 300
	s := startServerWith(t, BuiltinPolicy, func(c *Config) {
		// Long enough that the stalled connections outlive the test on a
		// loaded machine.
		c.Limits.ReadHeaderTimeout = time.Minute
	})
	limits := DefaultLimits()

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	conns := make([]*tls.Conn, stalled)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { conns[i] = stalledHeaders(t, s, limits.MaxHeaderBytes-1024) })
	}
	wg.Wait()
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	// Both ends live in this process: an upper bound on the server's share.
	t.Logf("%d stalled connections, each with %d header bytes sent: heap in use grew %d KiB (%d KiB a connection, client and server)",
		stalled, limits.MaxHeaderBytes-1024, (int64(after.HeapInuse)-int64(before.HeapInuse))>>10,
		(int64(after.HeapInuse)-int64(before.HeapInuse))/stalled>>10)

	leak := pod(container("app", false, all))
	d := manifest.Document{GVK: leak.GroupVersionKind(), Meta: leak.ObjectMeta}
	for range 5 {
		if resp := s.post(t, ValidatePath, createRequest(t, d, leak)); resp.Allowed || !strings.Contains(resp.Result.Message, "[device-env]") {
			t.Fatalf("a review beside %d stalled connections: %+v", stalled, resp)
		}
	}

	// A stalled connection that goes on past the limit is refused, and
	// so is a fresh one that sends too much at once.
	if _, err := fmt.Fprintf(conns[0], "%s\r\n\r\n", strings.Repeat("a", 8<<10)); err != nil {
		t.Fatal(err)
	}
	if line, err := statusLine(conns[0], 30*time.Second); err != nil || !strings.Contains(line, "431") {
		t.Errorf("headers past %d bytes: got %q (%v), want HTTP 431", limits.MaxHeaderBytes, line, err)
	}
	long := stalledHeaders(t, s, 2*limits.MaxHeaderBytes)
	if _, err := io.WriteString(long, "\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := statusLine(long, 30*time.Second); err != nil || !strings.Contains(line, "431") {
		t.Errorf("%d header bytes: got %q (%v), want HTTP 431", 2*limits.MaxHeaderBytes, line, err)
	}
	// Ordinary headers, well under the limit, pass.
	if resp := s.post(t, ValidatePath, createRequest(t, d, leak)); resp.Allowed {
		t.Fatalf("a review after the refusals: %+v", resp)
	}
}

// TestConnectionBound: with MaxConnections connections open, the next one
// is not served (its TLS handshake does not even start) until one of them
// closes; then it is.
func TestConnectionBound(t *testing.T) {
	const bound = 20
	s := startServerWith(t, BuiltinPolicy, func(c *Config) {
		c.Limits.MaxConnections = bound
		c.Limits.ReadHeaderTimeout = time.Minute
	})
	conns := make([]*tls.Conn, bound)
	for i := range conns {
		conns[i] = stalledHeaders(t, s, 16)
	}
	next, err := net.Dial("tcp", strings.TrimPrefix(s.base, "https://")) // the kernel accepts it; the server does not
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	_ = next.SetDeadline(time.Now().Add(60 * time.Second))
	wc := tls.Client(next, &tls.Config{RootCAs: s.pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	handshake := make(chan error, 1)
	go func() { handshake <- wc.Handshake() }()
	select {
	case err := <-handshake:
		t.Fatalf("connection %d of a bound of %d was served at once (handshake: %v), want it held back", bound+1, bound, err)
	case <-time.After(500 * time.Millisecond): // how long it must stay unserved
	}
	conns[0].Close()
	if err := <-handshake; err != nil {
		t.Fatalf("after a connection closed, the waiting one was not served: %v", err)
	}
	if _, err := fmt.Fprintf(wc, "POST %s HTTP/1.1\r\nHost: gpuguard\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", ValidatePath); err != nil {
		t.Fatal(err)
	}
	if line, err := statusLine(wc, 30*time.Second); err != nil || !strings.Contains(line, "400") {
		t.Errorf("the waiting connection's request: %q (%v), want the webhook's own HTTP 400", line, err)
	}
}

// TestStalledHandshakesAndHeadersAreCutOff: a connection that never
// finishes its TLS handshake, or its headers, is closed at
// ReadHeaderTimeout (net/http takes the handshake's deadline from it).
func TestStalledHandshakesAndHeadersAreCutOff(t *testing.T) {
	s := startServerWith(t, BuiltinPolicy, func(c *Config) { c.Limits.ReadHeaderTimeout = 200 * time.Millisecond })
	raw, err := net.Dial("tcp", strings.TrimPrefix(s.base, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := raw.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("a connection that sends no handshake: read %v, want EOF (closed by the server)", err)
	}
	c := stalledHeaders(t, s, 16)
	if _, err := statusLine(c, 30*time.Second); errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
		t.Errorf("a connection that stalls in its headers: %v, want it closed by the server", err)
	}
}

// TestHeaderMemoryBound: what the connections may hold in headers is
// bounded by MaxConnections × (MaxHeaderBytes + net/http's 4 KiB), and by
// default that is a small part of the chart's 256 MiB container
// (docs/operations.md).
func TestHeaderMemoryBound(t *testing.T) {
	l := DefaultLimits()
	if got, want := l.MaxHeaderMemory(), int64(l.MaxConnections)*int64(l.MaxHeaderBytes+4096); got != want {
		t.Errorf("MaxHeaderMemory = %d, want %d", got, want)
	}
	if got := l.MaxHeaderMemory(); got > 32<<20 {
		t.Errorf("default header memory bound %d MiB: over 32 MiB, an eighth of the chart's 256 MiB", got>>20)
	}
	// Before: 1 MiB of headers a connection and no bound on connections.
	if old := (Limits{MaxConnections: 150, MaxHeaderBytes: 1 << 20}).MaxHeaderMemory(); old < 150<<20 {
		t.Errorf("the old limits' bound at 150 connections: %d", old)
	}
}
