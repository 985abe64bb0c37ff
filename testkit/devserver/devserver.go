// Package devserver embeds a single-process Temporal server for the demo and
// the integration tests: all four services, SQLite persistence (a file that
// survives restarts, or memory), the namespace and the search attributes
// durabletrain uses, and optionally the Temporal Web UI. It is written
// against the server's public packages. It is the only package that imports
// the Temporal server (about 6 minutes to compile cold on 2 cores), so that
// the worker and starter binaries stay small.
package devserver

import (
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/durabletrain/durabletrain/internal/netport"

	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uioptions "github.com/temporalio/ui-server/v2/server/server_options"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	tlog "go.temporal.io/server/common/log"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
	"go.uber.org/zap"
)

// SearchAttributes are registered on the namespace for listing runs.
var SearchAttributes = map[string]enumspb.IndexedValueType{
	"DurabletrainState": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	"DurabletrainEpoch": enumspb.INDEXED_VALUE_TYPE_INT,
}

// Options configure the server. Zero values pick defaults.
type Options struct {
	IP        string // bind address; default 127.0.0.1
	Port      int    // frontend gRPC port; default 7233 (0 with Ephemeral picks a free one)
	UIPort    int    // Web UI port; 0 disables the UI
	Namespace string // default "default"
	DBFile    string // SQLite file; empty keeps everything in memory
	Log       *zap.Logger
	Ephemeral bool // pick free ports (tests)
	// SuggestContinueAsNewAfter is the history length at which the server
	// tells workflows to continue as new (limit.historyCount.suggestContinueAsNew;
	// 0 keeps Temporal's 4,096). Tests and benches lower it to cross
	// continue-as-new boundaries often.
	SuggestContinueAsNewAfter int
	// TaskQueuePartitions is how many partitions every task queue has
	// (matching.numTaskqueueRead/WritePartitions; 0 keeps Temporal's 4).
	// Tasks of one partition are matched in the order they were added;
	// across partitions, in no order: with 1, a gang's holds are served
	// before a later run's (deploy/temporal/durabletrain.yaml sets 1 for
	// the GPU queue).
	TaskQueuePartitions int
}

// Server is a running dev server.
type Server struct {
	srv  temporal.Server
	ui   *uiserver.Server
	addr string
	url  string
}

// Addr is the frontend's host:port for clients and workers.
func (s *Server) Addr() string { return s.addr }

// UIURL is the Web UI's address, or "" without a UI.
func (s *Server) UIURL() string { return s.url }

// Stop stops the UI and the server.
func (s *Server) Stop() {
	if s.ui != nil {
		s.ui.Stop()
	}
	s.srv.Stop()
}

// Start starts the server and returns once its frontend serves.
func Start(o Options) (*Server, error) {
	if o.IP == "" {
		o.IP = "127.0.0.1"
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	ports := &portPicker{}
	defer ports.release()
	picked := false
	if o.Port == 0 {
		if !o.Ephemeral {
			o.Port = 7233
		} else {
			o.Port, picked = ports.pick(), true
		}
	}
	// The server itself panics on a busy port: say it plainly first.
	if !picked {
		if err := portFree(o.IP, o.Port, "-port", "the frontend"); err != nil {
			return nil, err
		}
	}
	if o.UIPort > 0 {
		if err := portFree(o.IP, o.UIPort, "-ui-port", "the Web UI"); err != nil {
			return nil, err
		}
	}
	sqlConf := config.SQL{PluginName: sqliteplugin.PluginName}
	if o.DBFile == "" {
		sqlConf.ConnectAttributes = map[string]string{"mode": "memory", "cache": "shared"}
		sqlConf.DatabaseName = "durabletrain-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(o.Port)
	} else {
		sqlConf.ConnectAttributes = map[string]string{"mode": "rwc", "_journal_mode": "wal", "_synchronous": "normal"}
		sqlConf.DatabaseName = o.DBFile
		if _, err := os.Stat(o.DBFile); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(filepath.Dir(o.DBFile), 0o755); err != nil {
				return nil, err
			}
			if err := sqliteschema.SetupSchema(&sqlConf); err != nil {
				return nil, fmt.Errorf("devserver: creating the schema in %s: %w", o.DBFile, err)
			}
		} else if err := forgetMembers(o.DBFile); err != nil {
			return nil, err
		}
	}
	ns, err := sqliteschema.NewNamespaceConfig("active", o.Namespace, false, SearchAttributes)
	if err != nil {
		return nil, err
	}
	if err := sqliteschema.CreateNamespaces(&sqlConf, ns); err != nil {
		return nil, fmt.Errorf("devserver: creating namespace %q: %w", o.Namespace, err)
	}

	// The services reach each other and the frontend at the bind address, or
	// on loopback when the frontend binds every interface.
	local := o.IP
	if ip := net.ParseIP(o.IP); ip != nil && ip.IsUnspecified() {
		local = "127.0.0.1"
	}
	var conf config.Config
	conf.Global.Membership.MaxJoinDuration = 30e9
	conf.Global.Membership.BroadcastAddress = local
	conf.Persistence.DefaultStore = "sqlite"
	conf.Persistence.VisibilityStore = "sqlite"
	conf.Persistence.NumHistoryShards = 1
	conf.Persistence.DataStores = map[string]config.DataStore{"sqlite": {SQL: &sqlConf}}
	conf.ClusterMetadata = &cluster.Config{
		FailoverVersionIncrement: 10, MasterClusterName: "active", CurrentClusterName: "active",
		ClusterInformation: map[string]cluster.ClusterInformation{"active": {
			Enabled: true, InitialFailoverVersion: 1, RPCAddress: net.JoinHostPort(local, strconv.Itoa(o.Port)), ClusterID: "durabletrain-dev"}},
	}
	conf.DCRedirectionPolicy.Policy = "noop"
	service := func(frontend bool) config.Service {
		var s config.Service
		if frontend {
			s.RPC.GRPCPort, s.RPC.BindOnIP = o.Port, o.IP
		} else {
			s.RPC.GRPCPort, s.RPC.BindOnIP = ports.pick(), local
		}
		s.RPC.MembershipPort = ports.pick()
		return s
	}
	conf.Services = map[string]config.Service{"frontend": service(true), "history": service(false), "matching": service(false), "worker": service(false)}
	conf.Archival.History.State = "disabled"
	conf.Archival.Visibility.State = "disabled"
	conf.NamespaceDefaults.Archival.History.State = "disabled"
	conf.NamespaceDefaults.Archival.Visibility.State = "disabled"
	conf.PublicClient.HostPort = net.JoinHostPort(local, strconv.Itoa(o.Port))

	dyn := dynamicconfig.StaticClient{
		dynamicconfig.MakeKey("frontend.enableUpdateWorkflowExecution"): true,
	}
	if o.SuggestContinueAsNewAfter > 0 {
		dyn[dynamicconfig.HistoryCountSuggestContinueAsNew.Key()] = o.SuggestContinueAsNewAfter
	}
	if o.TaskQueuePartitions > 0 {
		dyn[dynamicconfig.MatchingNumTaskqueueReadPartitions.Key()] = o.TaskQueuePartitions
		dyn[dynamicconfig.MatchingNumTaskqueueWritePartitions.Key()] = o.TaskQueuePartitions
	}
	ports.release()
	srv, err := temporal.NewServer(
		temporal.WithConfig(&conf),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithLogger(tlog.NewZapLogger(o.Log)),
		temporal.WithAuthorizer(authorization.NewNoopAuthorizer()),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return authorization.NewNoopClaimMapper() }),
		temporal.WithDynamicConfigClient(dyn),
	)
	if err != nil {
		return nil, fmt.Errorf("devserver: %w", err)
	}
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("devserver: starting: %w", err)
	}
	s := &Server{srv: srv, addr: fmt.Sprintf("%s:%d", o.IP, o.Port)}
	if o.UIPort > 0 {
		s.ui = uiserver.NewServer(uioptions.WithConfigProvider(&uiconfig.Config{
			Host: o.IP, Port: o.UIPort, TemporalGRPCAddress: s.addr, EnableUI: true,
			CORS: uiconfig.CORS{CookieInsecure: true}, HideLogs: true,
		}))
		go func() {
			if err := s.ui.Start(); err != nil {
				o.Log.Error("temporal web UI stopped", zap.Error(err))
			}
		}()
		s.url = fmt.Sprintf("http://%s:%d", o.IP, o.UIPort)
	}
	return s, nil
}

// portFree says whether ip:port can be bound now, and if not, which flag to change.
func portFree(ip string, port int, flag, what string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("devserver: %s cannot listen on %s (%v): another devserver or Temporal server may be running; stop it, or choose a free port with %s",
			what, net.JoinHostPort(ip, strconv.Itoa(port)), err, flag)
	}
	return ln.Close()
}

// portPicker hands out free ports outside the ephemeral range (see
// netport.Free), holding each until release so that two picks never return
// the same one.
type portPicker struct{ held []net.Listener }

func (p *portPicker) pick() int {
	for range 64 {
		if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(netport.Free("127.0.0.1")))); err == nil {
			p.held = append(p.held, ln)
			return ln.Addr().(*net.TCPAddr).Port
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	p.held = append(p.held, ln)
	return ln.Addr().(*net.TCPAddr).Port
}

func (p *portPicker) release() {
	for _, ln := range p.held {
		ln.Close()
	}
	p.held = nil
}

// forgetMembers deletes the cluster membership a previous process left in
// the file. This server is the only member of its cluster, so every row there
// is stale; left in place, a killed server's services stay in the ring until
// they expire and the restarted server does not answer for about a minute.
func forgetMembers(dbFile string) error {
	db, err := sql.Open("sqlite", "file:"+dbFile+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return fmt.Errorf("devserver: opening %s: %w", dbFile, err)
	}
	defer db.Close()
	if _, err := db.Exec("DELETE FROM cluster_membership"); err != nil {
		return fmt.Errorf("devserver: clearing the stale cluster membership in %s: %w", dbFile, err)
	}
	return nil
}
