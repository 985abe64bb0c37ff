package bloburl

import (
	"net/url"
	"slices"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{
		"file:///var/lib/durabletrain/checkpoints?create_dir=1",
		"file:///tmp/runs%232/",
		"file://localhost/tmp/x",
		"s3://my-bucket?prefix=runs/&region=eu-west-1",
		"s3://my.bucket/",
		"gs://bucket-1",
		"azblob://container",
		"mem://",
	} {
		if err := Check("checkpoint.url", ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, c := range []struct{ raw, want string }{
		{"", "a blob URL"},
		{"/var/lib/x", "a blob URL"},
		{"file:relative", "a blob URL"},
		{"file://relative/dir", `"relative" reads as a host`},
		{"file:///a/../b", "a clean absolute path (/b"},
		{"file:///a//b", "a clean absolute path"},
		{"file:///runs#2", "%23"},
		{"s3://user:secret@bucket", "no user or password"},
		{"s3://bucket/runs", "s3://bucket?prefix=runs/"},
		{"s3://", "the bucket is missing"},
		{"s3://Bad_Bucket", "lower-case letters"},
		{"s3://bucket?prefix=%zz", "query parameters that parse"},
		{"file:///a b", "without spaces or control characters"},
		{"file:///a\x00b", "without spaces or control characters"},
		{"ftp://host/x", "file://, s3://, gs://, azblob://, mem://"},
		{"file:///" + strings.Repeat("x", MaxBytes), "at most 2048 bytes"},
	} {
		err := Check("checkpoint.url", c.raw)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "checkpoint.url is ") {
			t.Errorf("%q: %v; want an error naming checkpoint.url and saying %q", c.raw, err, c.want)
		}
		if err != nil && len(err.Error()) > 400 {
			t.Errorf("%q: the error is %d bytes; a user's string is shown bounded", c.raw, len(err.Error()))
		}
	}
}

// FuzzCheck: no input panics, and what Check accepts parses, has a known
// scheme and no fragment or credentials.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"file:///a", "s3://b?prefix=x/", "mem://", "file:///a#b", "s3://u:p@b", "gs://b/c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if Check("u", raw) != nil {
			return
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse: %v", raw, err)
		}
		if u.Fragment != "" || u.User != nil || !slices.Contains(Schemes(), u.Scheme) {
			t.Fatalf("accepted %q: scheme %q, fragment %q, user %v", raw, u.Scheme, u.Fragment, u.User)
		}
	})
}

// A path with the characters a URL gives meaning to comes back whole, and
// its URL passes Check.
func TestFromPathRoundTrips(t *testing.T) {
	for _, p := range []string{"/tmp/x", "/home/me/My Projects/durabletrain", "/tmp/runs#2", "/tmp/a?b=c", "/tmp/100%", "/tmp/a,b", "/tmp/é ü/", "/"} {
		u := FromPath(p)
		if err := Check("checkpoint.url", u); err != nil {
			t.Errorf("FromPath(%q) = %s, refused: %v", p, u, err)
		}
		if err := Check("checkpoint.url", u+"?create_dir=1"); err != nil {
			t.Errorf("FromPath(%q) with a query, refused: %v", p, err)
		}
		if strings.Contains(u, ",") {
			t.Errorf("FromPath(%q) = %s: a ',' would split a list of roots", p, u)
		}
		back, err := LocalPath("url", u+"?metadata=skip")
		if err != nil || back != p {
			t.Errorf("LocalPath(FromPath(%q)) = %q, %v", p, back, err)
		}
	}
	// file://data/x names the host "data": not the folder /x.
	for _, raw := range []string{"s3://bucket", "file:relative", "mem://", "%zz", "file://data/x", "file:///a/../b"} {
		if _, err := LocalPath("dataset.url", raw); err == nil || !strings.Contains(err.Error(), "dataset.url is") || !strings.Contains(err.Error(), "file:///") {
			t.Errorf("LocalPath(%q): %v; want an error naming dataset.url", raw, err)
		}
	}
}

// A flag's absolute path becomes the URL of that very folder, cleaned and
// escaped; a URL is taken as written; anything else is an error saying that
// a path or a URL would do.
func TestFromFlagTakesPathsAndURLs(t *testing.T) {
	for _, c := range []struct{ in, url, path string }{
		{"/var/lib/ckpt", "file:///var/lib/ckpt", "/var/lib/ckpt"},
		{"/var/lib/ckpt/", "file:///var/lib/ckpt/", "/var/lib/ckpt/"},
		{"/a//b/./c/../d/", "file:///a/b/d/", "/a/b/d/"},
		{"/home/me/My Runs,2#a?b", "file:///home/me/My%20Runs%2C2%23a%3Fb", "/home/me/My Runs,2#a?b"},
		{"/", "file:///", "/"},
		{"s3://bucket?prefix=a/", "s3://bucket?prefix=a/", ""},
		{"file:///x", "file:///x", "/x"},
	} {
		got, err := FromFlag("-checkpoint", c.in)
		if err != nil || got != c.url {
			t.Errorf("FromFlag(%q) = %q, %v; want %q", c.in, got, err, c.url)
			continue
		}
		if c.path == "" {
			continue
		}
		if back, err := LocalPath("-checkpoint", got); err != nil || back != c.path {
			t.Errorf("LocalPath(FromFlag(%q)) = %q, %v; want %q", c.in, back, err, c.path)
		}
	}
	for in, msg := range map[string]string{
		"relative/dir": `-checkpoint is "relative/dir"; want an absolute path on the workers`,
		"":             `-checkpoint is ""; want an absolute path on the workers`,
		"file://data/": `-checkpoint is "file://data/"; want file:///absolute/path (three slashes`,
		"ftp://host/x": `-checkpoint is "ftp://host/x"; want a URL with scheme`,
	} {
		if got, err := FromFlag("-checkpoint", in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("FromFlag(%q) = %q, %v; want an error containing %q", in, got, err, msg)
		}
	}
}
