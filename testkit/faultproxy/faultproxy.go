// Package faultproxy owns the faults tests put between a client and a real
// HTTP server (an S3-compatible store such as MinIO): a reverse proxy that
// passes requests through, or answers chosen ones with an error status the
// server could send (503 SlowDown, as S3 does under load), or holds them
// without an answer (a hung or partitioned server), or cuts their connection,
// before the answer or halfway through its body, or passes them late.
// What it passes, it passes untouched, so the client talks to the real server.
package faultproxy

import (
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is what the proxy does with a request.
type Fault int

const (
	Pass     Fault = iota // forwarded to the server, its answer returned
	Fail                  // answered 503 SlowDown, as S3 answers when it sheds load
	Hang                  // held, unanswered, until the client gives up or the proxy closes
	Cut                   // its connection closed without an answer
	Truncate              // forwarded, but its connection cut halfway through the answer's body
	Slow                  // forwarded after the proxy's delay (SetDelay): a store that takes its time
)

// Rule picks the fault for a request; nil passes everything.
type Rule func(*http.Request) Fault

// Proxy is a running proxy in front of one server.
type Proxy struct {
	// URL is the proxy's address, to give the client in place of the server's.
	URL string

	srv     *httptest.Server
	mu      sync.Mutex
	rule    Rule
	closing chan struct{}
	faulted atomic.Int64
	delay   atomic.Int64 // Slow's pause, in nanoseconds
}

// Start proxies to the server at target (http://host:port).
func Start(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	p := &Proxy{closing: make(chan struct{})}
	forward := httputil.NewSingleHostReverseProxy(u)
	forward.ErrorLog = log.New(io.Discard, "", 0)
	truncated := httputil.NewSingleHostReverseProxy(u)
	truncated.ErrorLog = forward.ErrorLog
	truncated.ModifyResponse = func(resp *http.Response) error {
		if resp.ContentLength > 1 {
			resp.Body = &halfBody{r: resp.Body, left: resp.ContentLength / 2}
		}
		return nil
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		rule := p.rule
		p.mu.Unlock()
		f := Pass
		if rule != nil {
			f = rule(r)
		}
		if f != Pass {
			p.faulted.Add(1)
		}
		switch f {
		case Fail:
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`))
		case Hang:
			select {
			case <-r.Context().Done():
			case <-p.closing:
			}
		case Cut:
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					if tc, ok := c.(*net.TCPConn); ok {
						tc.SetLinger(0) // a reset, not an orderly close
					}
					c.Close()
				}
			}
		case Truncate:
			truncated.ServeHTTP(w, r) // a body that fails halfway: the proxy aborts the connection
		case Slow:
			select {
			case <-time.After(time.Duration(p.delay.Load())):
				forward.ServeHTTP(w, r)
			case <-r.Context().Done():
			case <-p.closing:
			}
		default:
			forward.ServeHTTP(w, r)
		}
	}))
	p.srv.Start()
	p.URL = p.srv.URL
	return p, nil
}

// halfBody is a response body that fails after its first left bytes.
type halfBody struct {
	r    io.ReadCloser
	left int64
}

func (h *halfBody) Read(p []byte) (int, error) {
	if h.left <= 0 {
		return 0, errors.New("faultproxy: the body is cut here")
	}
	n, err := h.r.Read(p[:min(int64(len(p)), h.left)])
	h.left -= int64(n)
	return n, err
}

func (h *halfBody) Close() error { return h.r.Close() }

// Set makes rule pick the fault of every request from now on (nil: none).
func (p *Proxy) Set(rule Rule) {
	p.mu.Lock()
	p.rule = rule
	p.mu.Unlock()
}

// SetDelay sets how long a Slow request waits before it is forwarded.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Faulted counts the requests the proxy has not passed through.
func (p *Proxy) Faulted() int64 { return p.faulted.Load() }

// Close releases the requests it holds and stops the proxy.
func (p *Proxy) Close() {
	close(p.closing)
	p.srv.CloseClientConnections()
	p.srv.Close()
}
