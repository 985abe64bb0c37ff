// Package bloburl owns what a blob storage URL may be: the one rule that
// specs, worker policies and the checkpoint store all check, so that a URL
// refused in a spec is refused the same way when a Go caller, or a URL read
// back from a run's progress, reaches the store.
package bloburl

import (
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/durabletrain/durabletrain/internal/strictjson"
)

// MaxBytes bounds a URL's length.
const MaxBytes = 2048

// schemes are the gocloud.dev/blob URL schemes durabletrain accepts (package
// blobdrivers registers a driver for each).
var schemes = []string{"file", "s3", "gs", "azblob", "mem"}

// Schemes returns the accepted URL schemes.
func Schemes() []string { return append([]string(nil), schemes...) }

var bucketPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,221}[a-z0-9]$`)

// Check parses a blob URL and checks its parts: a known scheme; for file://,
// an absolute, clean path and no host; for s3, gs and azblob, a bucket name
// and no path (a folder goes in ?prefix=); query parameters that parse; no
// credentials, no fragment, no spaces or control characters. field names the
// URL in the error, which also says what would be accepted.
func Check(field, raw string) error {
	bad := func(why string) error {
		return fmt.Errorf("%s is %s; want %s", field, strictjson.Quote(raw), why)
	}
	if len(raw) > MaxBytes {
		return bad(fmt.Sprintf("a URL of at most %d bytes", MaxBytes))
	}
	if strings.ContainsAny(raw, "\x00\n\r\t ") {
		return bad("a URL without spaces or control characters (escape them as %20, …)")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return bad("a blob URL: file:///absolute/path, s3://bucket, gs://bucket, azblob://container or mem://")
	}
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return bad("query parameters that parse (" + err.Error() + ")")
	}
	if u.User != nil {
		return bad("no user or password in the URL (credentials come from the worker's environment)")
	}
	if strings.Contains(raw, "#") {
		// A '#' starts the URL's fragment, which every store ignores: the
		// store would be the path before it.
		return bad("no '#' (it starts a URL's fragment; write a '#' in a path as %23)")
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return bad(fmt.Sprintf("file:///absolute/path (three slashes; %q reads as a host)", u.Host))
		}
		if !strings.HasPrefix(u.Path, "/") {
			return bad("file:///absolute/path")
		}
		if clean := path.Clean(u.Path); clean != strings.TrimSuffix(u.Path, "/") && clean != u.Path {
			return bad(fmt.Sprintf("a clean absolute path (%s, without . or .. or //)", clean))
		}
	case "s3", "gs", "azblob":
		if u.Host == "" {
			return bad(u.Scheme + "://bucket-name (the bucket is missing)")
		}
		if !bucketPattern.MatchString(u.Host) {
			return bad(u.Scheme + "://bucket-name: 3-223 lower-case letters, digits, . or -")
		}
		if u.Path != "" && u.Path != "/" {
			return bad(fmt.Sprintf("%s://%s?prefix=%s/ (a folder goes in ?prefix=, not in the path)", u.Scheme, u.Host, strings.Trim(u.Path, "/")))
		}
	case "mem":
	default:
		return bad("a URL with scheme " + strings.Join(schemes, "://, ") + "://")
	}
	return nil
}

// FromPath is the file:// URL of the absolute local path p, escaped where a
// URL needs it (a space as %20, '#' as %23, '?' as %3F, '%' as %25), so
// that the store opens p itself: "file://" + p would cut p at a '#' or '?'
// and be refused for a space. A ',' is written %2C, so that the URL can
// stand in a comma-separated list (a worker's -storage-roots).
func FromPath(p string) string {
	u := (&url.URL{Scheme: "file", Path: filepath.ToSlash(p)}).String()
	return strings.ReplaceAll(u, ",", "%2C")
}

// FromFlag is the blob URL a command-line flag's value names: an absolute
// local path (one starting with '/') is the file:// URL of that path, cleaned
// and with its trailing '/' kept (FromPath escapes it); anything else is
// taken to be a URL, as written. A value that is neither is an error naming
// flag that says both forms are accepted (a relative path is the likely
// slip: the path is opened on the workers, not where the flag was given).
func FromFlag(flag, v string) (string, error) {
	if !IsFlagPath(v) {
		if err := Check(flag, v); err != nil {
			if !strings.Contains(v, "://") {
				return "", fmt.Errorf("%s is %s; want an absolute path on the workers (/var/lib/durabletrain/ckpt) or a blob URL (file:///absolute/path, s3://bucket?prefix=dir/, gs://bucket, azblob://container, mem://)", flag, strictjson.Quote(v))
			}
			return "", err
		}
		return v, nil
	}
	p := filepath.Clean(v)
	if strings.HasSuffix(v, "/") && p != "/" {
		p += "/"
	}
	return FromPath(p), nil
}

// IsFlagPath says whether FromFlag takes a flag's value v to be a local
// path rather than a URL.
func IsFlagPath(v string) bool { return strings.HasPrefix(v, "/") }

// LocalPath is the local path a file:// URL names, its escapes undone and
// its query left off: the inverse of FromPath. A URL that Check refuses, or
// one of another scheme, is an error naming field.
func LocalPath(field, raw string) (string, error) {
	if err := Check(field, raw); err != nil {
		return "", err
	}
	u, _ := url.Parse(raw)
	if u.Scheme != "file" {
		return "", fmt.Errorf("%s is %s; want a file:///absolute/path URL", field, strictjson.Quote(raw))
	}
	return filepath.FromSlash(u.Path), nil
}
