package connect

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all PEM, and returns their paths.
func pki(t *testing.T) (ca, serverCert, serverKey, clientCert, clientKey string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
		return p
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			DNSNames: []string{"temporal.internal"}, ExtKeyUsage: []x509.ExtKeyUsage{usage}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, _ := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		kder, _ := x509.MarshalECPrivateKey(k)
		return write(name+".pem", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", kder)
	}
	serverCert, serverKey = issue("server", 2, x509.ExtKeyUsageServerAuth)
	clientCert, clientKey = issue("client", 3, x509.ExtKeyUsageClientAuth)
	return write("ca.pem", "CERTIFICATE", caDER), serverCert, serverKey, clientCert, clientKey
}

// TestMutualTLSFlags: the -tls-* flags make a TLS configuration that passes
// a server requiring a client certificate from the CA, and the server's
// certificate is checked against -tls-ca by -tls-server-name.
func TestMutualTLSFlags(t *testing.T) {
	clean(t)
	ca, sCert, sKey, cCert, cKey := pki(t)
	pair, err := tls.LoadX509KeyPair(sCert, sKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(ca)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	handshake := func(o Options) error {
		opts, err := o.ClientOptions(zap.NewNop())
		if err != nil {
			return err
		}
		if opts.ConnectionOptions.TLS == nil {
			return errNoTLS
		}
		c, err := tls.Dial("tcp", ln.Addr().String(), opts.ConnectionOptions.TLS)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Read(make([]byte, 2)) // the server's verdict on our certificate
		return err
	}
	if err := handshake(Options{TLSCert: cCert, TLSKey: cKey, TLSCA: ca, TLSServerName: "temporal.internal"}); err != nil {
		t.Fatalf("mutual TLS with the flags: %v", err)
	}
	if err := handshake(Options{TLSCA: ca, TLSServerName: "temporal.internal"}); err == nil {
		t.Fatal("a client without a certificate passed a server that requires one")
	}
	if err := handshake(Options{TLSCert: cCert, TLSKey: cKey, TLSCA: ca, TLSServerName: "someone-else"}); err == nil {
		t.Fatal("a server certificate for another name was accepted")
	}
	for name, tc := range map[string]struct {
		o    Options
		want string
	}{
		"cert without key": {Options{TLSCert: cCert}, "give both"},
		"CA not PEM":       {Options{TLSCA: cKey + ".missing"}, "-tls-ca"},
		"key not a key":    {Options{TLSCert: cCert, TLSKey: ca}, "-tls-cert/-tls-key"},
	} {
		if _, err := tc.o.ClientOptions(zap.NewNop()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error containing %q", name, err, tc.want)
		}
	}
}

var errNoTLS = &net.AddrError{Err: "no TLS configuration"}

// TestCodecKeyFile: -codec-key-file puts the encrypting converter in the
// client options; a key file others can read is refused.
func TestCodecKeyFile(t *testing.T) {
	clean(t)
	path := filepath.Join(t.TempDir(), "codec.key")
	os.WriteFile(path, []byte(strings.Repeat("k", 40)), 0o600)
	opts, err := Options{CodecKeyFile: path}.ClientOptions(zap.NewNop())
	if err != nil || opts.DataConverter == nil {
		t.Fatalf("codec key file: %v", err)
	}
	p, _ := opts.DataConverter.ToPayload("the spec")
	if strings.Contains(string(p.Data), "the spec") {
		t.Fatal("the client's converter does not encrypt")
	}
	os.Chmod(path, 0o644)
	if _, err := (Options{CodecKeyFile: path}).ClientOptions(zap.NewNop()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable key file: %v", err)
	}
}
