package policy

import (
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/durabletrain/durabletrain/spec"
)

// CheckTracker refuses an MLflow tracking server (a spec's
// mlflow.tracking_uri) that p.Trackers does not list: the workflows'
// worker would make requests to it, so no spec may point it at a server of
// its choosing (the worker's own loopback services, its cloud's metadata
// address). A listed URL allows the same scheme, host and port, and paths
// at or under its own; "*" allows any.
func (p Policy) CheckTracker(raw string) error {
	if err := spec.CheckTrackingURI("mlflow.tracking_uri", raw); err != nil {
		return refuse("%v", err)
	}
	if len(p.Trackers) == 0 {
		return refuse("mlflow.tracking_uri %s: this worker logs to no MLflow tracking server (its -trackers is empty); start it with -trackers %s", raw, origin(raw))
	}
	u, _ := url.Parse(raw)
	for _, t := range p.Trackers {
		if t == "*" {
			return nil
		}
		l, err := url.Parse(t)
		if err != nil {
			continue
		}
		if strings.EqualFold(l.Scheme, u.Scheme) && strings.EqualFold(l.Host, u.Host) && pathUnder(u.Path, l.Path) {
			return nil
		}
	}
	return refuse("mlflow.tracking_uri %s is not among this worker's -trackers (%s)", raw, strings.Join(p.Trackers, ","))
}

// pathUnder says whether path p is at or under root, once each is cleaned
// (a "/mlflow/../admin" is not under "/mlflow"); an escaped path is
// compared as the server would decode it.
func pathUnder(p, root string) bool {
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	root = strings.TrimRight(path.Clean("/"+root), "/")
	p = path.Clean("/" + p)
	return root == "" || p == root || strings.HasPrefix(p, root+"/")
}

func origin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Scheme + "://" + u.Host
}

// ParseTrackers reads the -trackers flag: comma-separated http(s) URLs, or *.
func ParseTrackers(flag, v string) ([]string, error) {
	var out []string
	for _, t := range strings.Split(v, ",") {
		t = strings.TrimSpace(t)
		switch {
		case t == "":
			continue
		case t == "*":
			out = append(out, t)
			continue
		}
		if err := spec.CheckTrackingURI(flag, t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if strings.TrimSpace(v) != "" && len(out) == 0 {
		return nil, fmt.Errorf("%s is %q; want MLflow tracking server URLs, comma-separated, or *", flag, v)
	}
	return out, nil
}
