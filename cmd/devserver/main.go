// Command devserver runs an embedded Temporal server with the Web UI and a
// SQLite file, with the namespace and search attributes durabletrain uses.
//
//	devserver -db .durabletrain/temporal.db -port 7233 -ui-port 8233
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/internal/buildinfo"
	"github.com/durabletrain/durabletrain/testkit/devserver"
)

func main() {
	ip := flag.String("ip", "127.0.0.1", "address to bind the frontend and the UI to")
	port := flag.Int("port", 7233, "frontend gRPC port")
	uiPort := flag.Int("ui-port", 8233, "Web UI port (0: no UI)")
	db := flag.String("db", ".durabletrain/temporal.db", "SQLite file (empty: in memory, lost on exit)")
	ns := flag.String("namespace", "default", "namespace to create")
	verbose := flag.Bool("v", false, "log the server's own lines")
	public := flag.Bool("insecure-public", false, "allow an -ip other than loopback: the dev server has no TLS and no authorizer, so whoever reaches it may start, signal and read every workflow; only on a private network (a container network, a test bridge)")
	suggestCAN := flag.Int("suggest-continue-as-new", 0, "history length at which workflows are told to continue as new (0: Temporal's 4096); lower crosses the boundary often, for tests and benchmarks")
	partitions := flag.Int("task-queue-partitions", 0, "partitions of every task queue (0: Temporal's 4); 1 matches a queue's tasks in the order they came, so gangs form whole in the order runs asked")
	version := flag.Bool("version", false, "print the version and build ID, and exit")
	flag.Parse()
	if *version {
		fmt.Println(buildinfo.String("devserver"))
		return
	}
	if err := checkBind(*ip, *public); err != nil {
		fmt.Fprintln(os.Stderr, "devserver:", err)
		os.Exit(2)
	}
	log := zap.NewNop()
	if *verbose {
		log, _ = zap.NewDevelopment()
	}
	srv, err := devserver.Start(devserver.Options{IP: *ip, Port: *port, UIPort: *uiPort, Namespace: *ns, DBFile: *db, Log: log, SuggestContinueAsNewAfter: *suggestCAN, TaskQueuePartitions: *partitions})
	if err != nil {
		fmt.Fprintln(os.Stderr, "devserver:", err)
		os.Exit(1)
	}
	fmt.Printf("devserver: Temporal frontend on %s, namespace %q", srv.Addr(), *ns)
	if srv.UIURL() != "" {
		fmt.Printf(", Web UI at %s", srv.UIURL())
	}
	fmt.Println()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	srv.Stop()
}

// checkBind refuses a bind address other than loopback unless the operator
// says the network is private.
func checkBind(ip string, public bool) error {
	addr := net.ParseIP(ip)
	if addr == nil {
		return fmt.Errorf("-ip %q is not an IP address; want 127.0.0.1 (or another address with -insecure-public)", ip)
	}
	if addr.IsLoopback() || public {
		return nil
	}
	return fmt.Errorf("-ip %s would serve Temporal without TLS or authorization to everyone who reaches this host; keep 127.0.0.1, or add -insecure-public on a private network", ip)
}
