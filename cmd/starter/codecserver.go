package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/codec"
	"github.com/durabletrain/durabletrain/internal/keyfile"
)

// codecServer serves the payload codec for the Temporal UI and CLI, so that
// people who hold the codec key see runs' specs and progress while history
// keeps only ciphertext:
//
//	starter codec-server -codec-key-file codec.key -listen 127.0.0.1:8089 -cors-origin http://localhost:8233
//	temporal workflow show -w RUN --codec-endpoint http://127.0.0.1:8089
func codecServer(args []string) {
	fs := flag.NewFlagSet("codec-server", flag.ExitOnError)
	keyFile := fs.String("codec-key-file", os.Getenv("DURABLETRAIN_CODEC_KEY_FILE"), "file holding the payload encryption key, as given to the starters and workers, then older keys' files, comma-separated (default $DURABLETRAIN_CODEC_KEY_FILE)")
	listen := fs.String("listen", "127.0.0.1:8089", "address to serve the codec on (keep it private: it decrypts for whoever reaches it)")
	origins := fs.String("cors-origin", "", "web origins allowed to call it, comma-separated: the Temporal UI's address (e.g. http://localhost:8233); none for the CLI only")
	fs.Parse(args)
	if *keyFile == "" {
		fail(exitUsage, "codec-server: -codec-key-file is required")
	}
	var keys [][]byte // the current key, then older ones (rotation)
	for _, path := range strings.Split(*keyFile, ",") {
		key, err := keyfile.Read(strings.TrimSpace(path), "-codec-key-file")
		if err != nil {
			fail(exitUsage, "codec-server: %v", err)
		}
		keys = append(keys, key)
	}
	c, err := codec.New(keys[0], keys[1:]...)
	if err != nil {
		fail(exitUsage, "codec-server: %v", err)
	}
	var allow []string
	for _, o := range strings.Split(*origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			allow = append(allow, o)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fail(exitUsage, "codec-server: -listen: %v", err)
	}
	fmt.Printf("codec server for key %s on http://%s (temporal ... --codec-endpoint http://%s)\n", c.KeyID(), ln.Addr(), ln.Addr())
	srv := &http.Server{Handler: c.Handler(allow...), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fail(exitFailed, "codec-server: %v", err)
	}
}
